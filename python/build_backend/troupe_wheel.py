"""The build backend (PEP 517) behind `python3 -m pip install ./python`: builds the extension
with CMake from the repository (only the libraries and the module: no tests, tools or examples)
and packs it with the package's Python files into a wheel for this interpreter. Nothing is
downloaded; the build needs what scripts/setup.sh installs.

    --config-settings build-dir=DIR   build in DIR (an existing build tree is reused as it is
                                      configured); default build-wheel/ in the repository
"""

import base64
import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import zipfile

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "troupe"


def _version():
    with open(os.path.join(REPOSITORY, "CMakeLists.txt"), encoding="utf-8") as f:
        return re.search(r"project\(troupe VERSION ([0-9.]+)", f.read()).group(1)


def _tag():
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{python}-{python}-{platform}"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\n"
            "Summary: troupe's Python module: actors, pools and jobs on Cap'n Proto RPC\n"
            "Requires-Python: >=3.9\n")


def _wheel_file():
    return (f"Wheel-Version: 1.0\nGenerator: troupe_wheel\nRoot-Is-Purelib: false\n"
            f"Tag: {_tag()}\n")


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = f"{NAME}-{_version()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    for name, text in (("METADATA", _metadata()), ("WHEEL", _wheel_file())):
        with open(os.path.join(metadata_directory, dist_info, name), "w",
                  encoding="utf-8") as f:
            f.write(text)
    return dist_info


def _build(build_dir):
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        subprocess.run(["cmake", "-S", REPOSITORY, "-B", build_dir, "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release", "-DTROUPE_BUILD_TESTS=OFF",
                        "-DTROUPE_BUILD_BENCH=OFF", "-DTROUPE_BUILD_EXAMPLES=OFF",
                        "-DTROUPE_BUILD_TOOLS=OFF", "-DTROUPE_BUILD_PYTHON=ON",
                        "-DTROUPE_INSTALL=OFF"], check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", build_dir, "--target", "troupe_python"], check=True,
                   stdout=sys.stderr)
    package = os.path.join(build_dir, "python", NAME)
    files = sorted(f for f in os.listdir(package)
                   if f.endswith((".py", ".pyi")) or f == "py.typed"
                   or (f.startswith("_troupe") and f.endswith(".so")))
    if not any(f.endswith(".so") for f in files):
        raise RuntimeError(f"the build in {build_dir} made no extension module")
    return package, files


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    settings = config_settings or {}
    build_dir = os.path.abspath(settings.get("build-dir") or
                                os.path.join(REPOSITORY, "build-wheel"))
    package, files = _build(build_dir)
    dist_info = f"{NAME}-{_version()}.dist-info"
    wheel_name = f"{NAME}-{_version()}-{_tag()}.whl"
    records = []

    def add(archive, name, data):
        archive.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        records.append(f"{name},sha256={digest},{len(data)}")

    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w",
                         zipfile.ZIP_DEFLATED) as archive:
        for f in files:
            with open(os.path.join(package, f), "rb") as source:
                add(archive, f"{NAME}/{f}", source.read())
        add(archive, f"{dist_info}/METADATA", _metadata().encode())
        add(archive, f"{dist_info}/WHEEL", _wheel_file().encode())
        records.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return wheel_name
