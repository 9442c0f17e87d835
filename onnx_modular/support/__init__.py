"""Which FX nodes an accelerator runs: op names (ATen and ONNX), callables, ORT kernels."""
