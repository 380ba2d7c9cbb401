"""Build hook for the one optional C extension; everything else is configured in pyproject.toml.

``raypipe.kernels._jpegregion`` decodes only the part of a JPEG a crop reads (libjpeg-turbo's partial
decoding, which no maintained Python binding exposes). It needs a C compiler and libjpeg-turbo's headers
(Debian/Ubuntu: ``libjpeg-turbo8-dev`` or ``libjpeg62-turbo-dev``). ``optional=True``: without them the
install still succeeds and raypipe decodes whole images with simplejpeg, with identical pixels.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "raypipe.kernels._jpegregion",
            ["raypipe/kernels/_jpegregion.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
