"""tinyengine's native modules: _C (a setuptools C extension) and _kernels (built with CMake, which
fetches the tinykernels library with FetchContent; TINYKERNELS_SRC_DIR points it at a local copy)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def tool(name):
    """cmake / ninja: on PATH, else from their PyPI wheels (build requirements)."""
    found = shutil.which(name)
    if found:
        return found
    module = __import__(name)
    return os.path.join(module.CMAKE_BIN_DIR if name == "cmake" else module.BIN_DIR, name)


class BuildExt(build_ext):
    def build_extension(self, ext):
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        build = Path(self.build_temp).resolve() / "cmake"
        build.mkdir(parents=True, exist_ok=True)
        device = os.environ.get("TINYENGINE_TARGET_DEVICE", "cpu")
        subprocess.check_call([tool("cmake"), "-S", str(HERE), "-B", str(build), "-G", "Ninja",
                               f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}", "-DCMAKE_BUILD_TYPE=Release",
                               f"-DTINYENGINE_TARGET_DEVICE={device}", f"-DPython_EXECUTABLE={sys.executable}",
                               f"-DTINYENGINE_EXT_OUTPUT={out}"])
        subprocess.check_call([tool("cmake"), "--build", str(build), "-j", os.environ.get("MAX_JOBS", "1")])


setup(ext_modules=[Extension("tinyengine._C", ["csrc/_C.c"]), CMakeExtension("tinyengine._kernels")],
      cmdclass={"build_ext": BuildExt})
