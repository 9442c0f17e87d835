"""``python -m onnx_modular``."""

import sys

from onnx_modular.cli import main

sys.exit(main())
