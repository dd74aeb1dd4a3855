"""The packaged app: build the PyInstaller bundle and the .deb with installer/build.sh, then run the
bundle's --self-test directly and from a `dpkg -x` root, check the first-run model install and what
the package declares. Builds without the embedded default model (--no-default-model) to stay within
a few minutes; the first-run test bundles a stand-in instead (DFLASH_BUNDLED_MODELS).

About 2.5 minutes on two cores (docs/installer.md): the tiny self-test models ~35 s, PyInstaller
~1.5 min from a cold cache, the .deb ~30 s.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NAME = "dflash-studio"
NOT_IN_BUNDLE = ("torch", "transformers", "optimum", "nncf", "tokenizers", "safetensors", "gguf", "diffusers")
pytest.importorskip("PyInstaller", reason="PyInstaller is not installed: `.venv/bin/pip install -e '.[installer]'` "
                                          "(installer/build.sh does it) to build and test the bundle")


def _tail(p: subprocess.CompletedProcess, n: int = 4000) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-n:]}\n--- stderr\n{p.stderr[-n:]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("installer-out")
    work = tmp_path_factory.mktemp("installer-work")
    t0 = time.perf_counter()
    p = subprocess.run(["bash", "installer/build.sh", "--no-default-model", "--out", str(out), "--work", str(work)],
                       cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, _tail(p)
    info = json.loads((out / "build-info.json").read_text())
    info.update(out=out, work=work, build_s=time.perf_counter() - t0, bundle_dir=out / NAME)
    print(f"\ninstaller build: {info['build_s']:.0f} s, bundle {info['bundle_mb']} MB, deb {info['deb_mb']} MB")
    return info


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "LD_LIBRARY_PATH"))}
    env.update(DFLASH_STUDIO_HOME=str(home), QT_QPA_PLATFORM="offscreen", **extra)
    return env


def _self_test(exe: Path, tmp_path: Path, *args: str) -> dict:
    report = tmp_path / f"selftest-{len(list(tmp_path.glob('selftest-*')))}.json"
    p = subprocess.run([str(exe), "--self-test", "--output", str(report), *args], cwd=tmp_path,
                       env=_env(tmp_path / "home"), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, _tail(p)
    r = json.loads(report.read_text())
    assert json.loads(p.stdout.strip().splitlines()[-1]) == r, "the JSON summary goes to stdout as well"
    return r


def _check_report(r: dict, platform: str = "offscreen") -> None:
    assert r["ok"] and r["frozen"], r
    steps = r["steps"]
    assert list(steps) == ["window_shown", "imports", "pipeline", "window_chat", "close"]
    assert all(s["ok"] for s in steps.values())
    win = steps["window_shown"]
    assert win["platform"] == platform and win["icon"] and win["title"] == "DFlash Studio"
    assert {"libqxcb.so", "libqoffscreen.so"} <= set(win["platform_plugins"])
    assert any(d["name"] == "CPU" for d in steps["imports"]["devices"])
    assert "_internal" in steps["imports"]["tokenizers_extension"], "the tokenizer extension must come from the bundle"
    pipe = steps["pipeline"]
    assert pipe["draft"] == "tiny-draft" and pipe["tokens"] == len(pipe["token_ids"]) > 0
    assert pipe["drafted"] > 0 and pipe["same_as_target_alone"]
    assert pipe["draft_trained"] and pipe["accepted"] > 0, "the trained tiny draft must get tokens accepted"
    chat = steps["window_chat"]
    assert chat["reply_chars"] > 0 and chat["stats"]["draft"] == "tiny-draft" and chat["stats"]["source"] == "engine"
    assert 0 < r["window_shown_s"] < 60


def test_bundle_self_test(built, tmp_path):
    bundle = built["bundle_dir"]
    r = _self_test(bundle / NAME, tmp_path)
    _check_report(r)
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir()), \
        "the self-test must not write into the user's data folder"
    internal = bundle / "_internal"
    for mod in NOT_IN_BUNDLE:
        assert not (internal / mod).exists(), f"{mod} must not be bundled"
    assert not list(internal.rglob("libtorch*")), "no torch libraries in the bundle"
    # The runtime pieces that import analysis cannot see.
    libs = {f.name for f in (internal / "openvino" / "libs").iterdir()}
    assert "libopenvino_intel_cpu_plugin.so" in libs and any(n.startswith("libopenvino_ir_frontend") for n in libs)
    assert not any("pytorch_frontend" in n or "tensorflow_frontend" in n for n in libs)
    assert (internal / "openvino_tokenizers" / "lib" / "libopenvino_tokenizers.so").is_file()
    assert list((internal / "openvino_genai").glob("libopenvino_genai.so*"))
    assert {"libqxcb.so", "libqoffscreen.so"} <= {f.name for f in (internal / "PySide6/Qt/plugins/platforms").iterdir()}


def _stand_in_default(tmp_path: Path, built: dict) -> Path:
    """A 'bundled default model' made from the tiny target, with a real completion marker."""
    from engine.markers import write_marker

    src = tmp_path / "bundled-models"
    folder = src / "SmolLM2-135M-Instruct-ov"  # engine.paths.default_target_dir().name
    shutil.copytree(built["work"] / "testdata" / "tiny-qwen3-ov", folder)
    write_marker(folder, extra={"weight_format": "int8"})
    return src


def test_first_run_installs_the_bundled_default_then_works_offline(built, tmp_path):
    exe = built["bundle_dir"] / NAME
    home = tmp_path / "home"
    # Without a bundled model: an honest exit with the ways to get one, no traceback.
    p = subprocess.run([str(exe), "prepare"], env=_env(home), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, _tail(p)
    assert "does not carry the embedded default model" in p.stderr and "source checkout" in p.stderr
    assert "Traceback" not in p.stderr
    # With one (the app's "Prepare now" dialog runs exactly this command line).
    env = _env(home, DFLASH_BUNDLED_MODELS=str(_stand_in_default(tmp_path, built)))
    p = subprocess.run([str(exe), "-m", "engine.cli", "prepare"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, _tail(p)
    target = home / "models" / "SmolLM2-135M-Instruct-ov"
    assert p.stdout.strip().splitlines()[-1] == str(target)
    assert "100.0% Prepared" in p.stderr
    from engine.markers import is_prepared

    assert is_prepared(target)
    p = subprocess.run([str(exe), "prepare"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Already prepared" in p.stderr, _tail(p)
    # Offline afterwards: the CLI finds the default target in the user data folder by itself.
    p = subprocess.run([str(exe), "generate", "--prompt", "def f(", "--max-new-tokens", "5", "--draft", "none",
                        "--json"], env=_env(home), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, _tail(p)
    out = json.loads(p.stdout)
    assert out["generated_tokens"] == 5 and out["target"] == str(target)
    # Exporting needs torch: a clear refusal, not an ImportError.
    p = subprocess.run([str(exe), "export", "--kind", "target", "--input", "x", "--output", "y"],
                       env=_env(home), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "source checkout" in p.stderr, _tail(p)


def _control(deb: Path) -> dict[str, str]:
    text = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    fields, key = {}, None
    for line in text.splitlines():
        if line.startswith(" ") and key:
            fields[key] += "\n" + line
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def _package_names(depends: str) -> set[str]:
    return {re.split(r"[\s(]", alt.strip())[0] for dep in depends.split(",") for alt in dep.split("|")}


@pytest.fixture(scope="module")
def deb_root(built, tmp_path_factory) -> Path:
    if not shutil.which("dpkg-deb"):
        pytest.skip("dpkg-deb is not available (not a Debian-based system)")
    root = tmp_path_factory.mktemp("deb-root")
    subprocess.run(["dpkg-deb", "-x", built["deb"], str(root)], check=True)
    return root


def test_deb_contents_and_declared_dependencies(built, deb_root):
    control = _control(Path(built["deb"]))
    assert control["Package"] == NAME and control["Architecture"]
    deps = _package_names(control["Depends"])
    for pkg in ("libxcb-cursor0", "libxkbcommon-x11-0", "libxcb-icccm4", "libxcb-keysyms1", "libxcb-image0",
                "libxcb-render-util0", "libxcb1", "libegl1", "libgl1"):
        assert pkg in deps, f"{pkg} must be declared"
    assert re.search(r"libc6 \(>= 2\.\d+\)", control["Depends"])
    launcher = deb_root / "usr/bin" / NAME
    assert launcher.is_file() and os.access(launcher, os.X_OK)
    desktop = (deb_root / "usr/share/applications" / f"{NAME}.desktop").read_text()
    for line in ("Type=Application", "Name=DFlash Studio", f"Exec={NAME} %F", f"Icon={NAME}", "Terminal=false"):
        assert line in desktop.splitlines()
    icons = deb_root / "usr/share/icons/hicolor"
    assert (icons / "scalable/apps" / f"{NAME}.svg").is_file()
    png = (icons / "256x256/apps" / f"{NAME}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (deb_root / "opt" / NAME / NAME).is_file()
    internal = deb_root / "opt" / NAME / "_internal"
    assert not list(internal.glob("libxcb-cursor.so*")), "the xcb extension libraries come from the declared packages"


def test_deb_xcb_plugin_dependencies_resolve_to_declared_packages(built, deb_root):
    """ldd on Qt's xcb plugin from the installed tree: every library it cannot find on this machine is
    one the .deb declares (apt installs it with the package), and every library that comes from the
    system belongs to a declared package (checked with dpkg -S where dpkg knows the file)."""
    internal = deb_root / "opt" / NAME / "_internal"
    qt = internal / "PySide6" / "Qt"
    env = {**os.environ, "LD_LIBRARY_PATH": f"{internal}:{qt / 'lib'}"}
    p = subprocess.run(["ldd", str(qt / "plugins/platforms/libqxcb.so")], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout
    depends = _package_names(_control(Path(built["deb"]))["Depends"])
    soname_package = _make_deb().SYSTEM_XCB
    missing = sorted(set(re.findall(r"^\s*(\S+)\s+=>\s+not found", p.stdout, re.M)))
    undeclared_missing = [lib for lib in missing if soname_package.get(lib) not in depends]
    assert not undeclared_missing, f"missing here and not declared by the .deb: {undeclared_missing}\n{p.stdout}"
    system = [m.group(1) for m in re.finditer(r"=>\s+(/\S+)", p.stdout) if str(internal) not in m.group(1)]
    declared = _installed_closure(depends)
    undeclared = []
    for lib in system:
        owner = _owner(lib)
        if owner is not None and owner not in declared:
            undeclared.append((lib, owner))
    assert not undeclared, f"system libraries from packages the .deb does not (even indirectly) depend on: {undeclared}"


def _make_deb():
    """installer/linux/make_deb.py as a module (the soname -> package table the .deb declares)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_deb", ROOT / "installer/linux/make_deb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _owner(path: str) -> str | None:
    """The installed package owning `path` (tries the resolved path too: /lib vs /usr/lib), or None."""
    for candidate in (path, os.path.realpath(path), path.replace("/lib/", "/usr/lib/", 1)):
        q = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if q.returncode == 0:
            return q.stdout.split(":")[0].strip()
    return None


def _installed_closure(packages: set[str]) -> set[str]:
    """The packages plus everything they depend on (recursively), as installed on this machine."""
    seen: set[str] = set()
    todo = list(packages)
    while todo:
        pkg = todo.pop()
        if pkg in seen:
            continue
        seen.add(pkg)
        q = subprocess.run(["dpkg-query", "-W", "-f", "${Depends},${Pre-Depends}", pkg], capture_output=True, text=True)
        if q.returncode == 0:
            todo.extend(n.split(":")[0] for n in _package_names(q.stdout) if n)
    return seen


def test_deb_self_test_from_temporary_root(deb_root, tmp_path):
    r = _self_test(deb_root / "usr/bin" / NAME, tmp_path)
    _check_report(r)
    assert r["executable"] == str(deb_root / "opt" / NAME / NAME)


@pytest.mark.skipif(not shutil.which("xvfb-run"), reason="xvfb-run is not installed (apt-get install xvfb)")
def test_deb_self_test_on_xcb_under_xvfb(deb_root, tmp_path):
    report = tmp_path / "xcb.json"
    p = subprocess.run(["xvfb-run", "-a", str(deb_root / "usr/bin" / NAME), "--self-test", "--platform", "xcb",
                        "--output", str(report)], env=_env(tmp_path / "home"), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, _tail(p)
    _check_report(json.loads(report.read_text()), platform="xcb")
