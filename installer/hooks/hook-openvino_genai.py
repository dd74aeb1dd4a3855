"""PyInstaller hook for openvino_genai: its C++ library, and openvino_tokenizers, which the binding
imports from C++ to find the tokenizer extension (invisible to import analysis)."""
from pathlib import Path

from PyInstaller.utils.hooks import get_package_paths

_, pkg = get_package_paths("openvino_genai")
binaries = [(str(f), "openvino_genai") for f in sorted(Path(pkg).iterdir())
            if f.is_file() and "openvino_genai" in f.name and (".so" in f.name or f.suffix in (".dll", ".dylib"))
            and not f.name.startswith("py_openvino_genai")]
hiddenimports = ["openvino", "openvino_tokenizers"]
