"""PyInstaller hook for openvino (pip wheel layout): the runtime, its device plugins and the IR frontend.

libopenvino finds its plugins and frontends by scanning the folder it was loaded from, so they must
sit next to it in openvino/libs and are never seen by import analysis (pyinstaller #8096,
openvino #15694). Frontends for other source formats (PyTorch, TensorFlow, ONNX, Paddle, JAX,
GGUF) are left out: the app only reads OpenVINO IR. Works for .so (Linux), .dll (Windows), .dylib.
"""
from pathlib import Path

from PyInstaller.utils.hooks import collect_submodules, get_package_paths

_, pkg = get_package_paths("openvino")
libs = Path(pkg) / "libs"
SKIP_FRONTENDS = ("pytorch", "tensorflow", "tensorflow_lite", "onnx", "paddle", "jax", "gguf")
# Python parts that exist only for conversion from other frameworks (they import torch & co).
SKIP_MODULES = ("openvino.tools", "openvino.torch", "openvino.frontend.pytorch", "openvino.frontend.tensorflow",
                "openvino.frontend.jax", "openvino.frontend.onnx", "openvino.frontend.paddle", "openvino.test_utils")


def _wanted(f: Path) -> bool:
    name = f.name.lower()
    if not (".so" in name or name.endswith((".dll", ".dylib"))):
        return False
    return not any(f"openvino_{fe}_frontend" in name for fe in SKIP_FRONTENDS)


binaries = [(str(f), "openvino/libs") for f in sorted(libs.iterdir()) if f.is_file() and _wanted(f)]
# The GPU plugin's kernel tuning cache, read from next to the plugin.
datas = [(str(f), "openvino/libs") for f in libs.glob("*.json")]
hiddenimports = collect_submodules("openvino", filter=lambda n: not n.startswith(SKIP_MODULES))
excludedimports = ["torch", "tensorflow", "jax", "onnx", "paddle", "transformers", "nncf", "optimum"]
