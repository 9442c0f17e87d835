"""Functions per model on vision and diffusion architectures (random weights, no downloads):
how many distinct prototypes a backend has to compile, and whether ONNX Runtime agrees.

    python scripts/prototype_zoo.py            # torchvision / timm models where installed
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch

import onnx_modular as om

sys.path.insert(0, "tests")


def torchvision_model(name: str, **kwargs: object) -> Callable[[], tuple]:
    def build() -> tuple:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, **kwargs).eval()
        return model, (torch.randn(1, 3, 64, 64),), None
    return build


def vit_dynamic() -> tuple:
    import torchvision

    model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=4,
                                                 num_heads=2, hidden_dim=32, mlp_dim=64).eval()
    return model, (torch.randn(2, 3, 32, 32),), ({0: torch.export.Dim("batch", max=16)},)


def diffusion(name: str) -> Callable[[], tuple]:
    def build() -> tuple:
        import test_prototypes

        model, args = test_prototypes.DIFFUSION[name]()
        return model, args, None
    return build


ZOO = {
    "squeezenet1_0": torchvision_model("squeezenet1_0"),
    "resnet18": torchvision_model("resnet18"),
    "densenet121": torchvision_model("densenet121"),
    "mobilenet_v3_small": torchvision_model("mobilenet_v3_small"),
    "efficientnet_b0": torchvision_model("efficientnet_b0"),
    "vit (dynamic batch)": vit_dynamic,
    **{name: diffusion(name) for name in ("flux", "sd3", "dit", "unet2d_condition",
                                          "autoencoder_kl")},
}


def main() -> None:
    names = sys.argv[1:] or list(ZOO)
    for name in names:
        torch.manual_seed(0)
        try:
            model, args, dynamic = ZOO[name]()
        except ImportError as e:
            print(f"{name:22s} skipped ({e.name} not installed)")
            continue
        start = time.perf_counter()
        result = om.export(model, args, dynamic_shapes=dynamic)
        seconds = time.perf_counter() - start
        calls = sum(1 for _ in getattr(result.report, "function_of_call", {}))
        ok = om.validate(model, args, result, providers="cpu").ok
        print(f"{name:22s} {len(result.model.functions):4d} functions for {calls:4d} calls "
              f"({seconds:.1f} s), ORT {'ok' if ok else 'MISMATCH'}", flush=True)


if __name__ == "__main__":
    main()
