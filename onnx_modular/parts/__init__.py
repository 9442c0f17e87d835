"""Parts on disk: the manifest format, the runner that chains them, Triton repositories."""
