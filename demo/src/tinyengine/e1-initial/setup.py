from setuptools import Extension, setup

setup(ext_modules=[Extension("tinyengine._C", ["csrc/_C.c"])])
