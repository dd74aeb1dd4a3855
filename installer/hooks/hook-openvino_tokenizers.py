"""PyInstaller hook for openvino_tokenizers: the extension library, loaded by path from
openvino_tokenizers/lib (the package looks in <package>/lib next to its __init__)."""
from pathlib import Path

from PyInstaller.utils.hooks import get_package_paths

_, pkg = get_package_paths("openvino_tokenizers")
lib = Path(pkg) / "lib"
binaries = [(str(f), "openvino_tokenizers/lib") for f in sorted(lib.rglob("*")) if f.is_file()
            and (".so" in f.name or f.suffix in (".dll", ".dylib"))]
# Converting tokenizers from Hugging Face (hf_parser, tiktoken) is an export-time feature.
excludedimports = ["transformers", "tiktoken", "torch", "sentencepiece", "tokenizers"]
