"""A non-editable install (`pip install .`) carries the package data the tool reads at run time
(templates, print.css, the message catalogs, hardware.toml, perfmodel.toml) and finds it
through the installed packages, not through the source tree."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
import core, ingest, report, runner
from core import hardware
from report import i18n, render
from core import perfmodel
print(json.dumps({
    "packages": [core.__file__, ingest.__file__, report.__file__, runner.__file__],
    "templates": str(render.TEMPLATES_DIR),
    "template": render.build_environment(html=True).get_template("note.html.j2").filename,
    "hardware": str(hardware.HARDWARE_TOML),
    "perfmodel": str(perfmodel.PERFMODEL_TOML),
    "locale": str(i18n.LOCALE_DIR),
    "languages": i18n.available_languages(),
    "gpus": len(hardware.gpu_keys()),
    "links": len(perfmodel.load_links()),
    "assumptions": type(perfmodel.load_assumptions()).__name__,
}))
"""


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory):
    """A clean copy of the working tree's tracked and untracked-not-ignored files, symlinks kept."""
    if shutil.which("git") is None:
        pytest.skip("git is needed to copy the tracked tree")
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    # a clean copy of the working tree (no build/ or egg-info left over from other builds)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if name.startswith(("examples/", "tests/", "benchmarks/")):
            continue
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_symlink():  # report/templates -> ../templates, core/hardware.toml -> ../hardware.toml
            (src / name).symlink_to(os.readlink(REPO / name))
        elif (REPO / name).is_file():
            shutil.copy2(REPO / name, src / name)
    return src


@pytest.fixture(scope="module")
def installed(source_tree, tmp_path_factory):
    """The tool installed with pip, non-editable, into a target folder (no dependencies)."""
    target = tmp_path_factory.mktemp("install") / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                          "--target", str(target), str(source_tree)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return target


def test_a_wheel_built_from_the_sdist_carries_the_data_files(source_tree, tmp_path):
    """The root's templates/ and hardware.toml reach the wheel as files through the package symlinks."""
    import tarfile
    import zipfile

    build = ("import sys; from setuptools import build_meta as b; "
             "print(getattr(b, sys.argv[1])(sys.argv[2]))")
    sdist = subprocess.run([sys.executable, "-c", build, "build_sdist", str(tmp_path)], cwd=source_tree,
                           capture_output=True, text=True, timeout=300)
    assert sdist.returncode == 0, sdist.stderr[-3000:]
    with tarfile.open(tmp_path / sdist.stdout.split()[-1]) as tar:
        tar.extractall(tmp_path / "sdist", filter="data")
    unpacked = next((tmp_path / "sdist").iterdir())
    wheel = subprocess.run([sys.executable, "-c", build, "build_wheel", str(tmp_path)], cwd=unpacked,
                           capture_output=True, text=True, timeout=300)
    assert wheel.returncode == 0, wheel.stderr[-3000:]
    names = set(zipfile.ZipFile(tmp_path / wheel.stdout.split()[-1]).namelist())
    expected = {f"report/templates/{p.name}" for p in (REPO / "templates").iterdir()} | {"core/hardware.toml"}
    assert expected <= names, sorted(expected - names)


def test_installed_packages_find_their_data(installed, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(installed)}
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(Path(p).is_relative_to(installed) for p in got["packages"]), got["packages"]
    for key in ("templates", "template", "hardware", "perfmodel", "locale"):
        assert Path(got[key]).is_relative_to(installed), (key, got[key])
    templates = Path(got["templates"])
    assert {p.name for p in (REPO / "templates").iterdir()} == {p.name for p in templates.iterdir()}
    assert (templates / "print.css").is_file() and (templates / "note.html.j2").is_file()
    assert "zh" in got["languages"]
    assert got["gpus"] > 0 and got["links"] > 0 and got["assumptions"] == "Assumptions"
