"""Build hook for the optional C extensions; everything else is configured in pyproject.toml.

``raypipe.kernels._jpegregion`` decodes only the part of a JPEG a crop reads (libjpeg-turbo's partial
decoding, which no maintained Python binding exposes). It needs a C compiler and libjpeg-turbo's headers
(Debian/Ubuntu: ``libjpeg-turbo8-dev`` or ``libjpeg62-turbo-dev``). ``optional=True``: without them the
install still succeeds and raypipe decodes whole images with simplejpeg, with identical pixels.

``raypipe.device._affine`` normalises uint8 batches on a CPU device in one fused, single-threaded pass
(2-3x torch's two passes there; same bits). It needs only a C compiler; without it torch's ops run.

``raypipe.kernels._warp`` runs Pillow's bilinear/bicubic affine transform of RGB images (timm's
auto-augment rotate, shear and translate) with Pillow's exact arithmetic, four pixels per AVX2
vector or eight per AVX-512 vector: same bytes as Pillow, 2.3-4.4x faster. Without it Pillow runs them.

``raypipe.kernels._resample`` is Pillow's antialiased bilinear/bicubic resize of RGB images with Pillow's
exact arithmetic (AVX2 where the CPU has it): the crop-and-resize of every training image,
1.6-2.1x faster (bilinear) than the OpenCV approximation it replaces and the same bytes as timm's Pillow
path. Without it OpenCV approximates Pillow's filter (mean error <= 2 levels, tested).

``raypipe.kernels._colorops`` runs timm's auto-augment colour ops (point tables, blends, Sharpness's
3x3 filter) on arrays with Pillow's arithmetic, so a policy never converts to PIL images: the same
bytes as timm's ops on Pillow. Without it the policies run on PIL images.
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
        ),
        Extension(
            "raypipe.device._affine",
            ["raypipe/device/_affine.c"],
            # -O3 vectorises the loops; no contraction, so the plain variant rounds like torch's
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "raypipe.kernels._warp",
            ["raypipe/kernels/_warp.c"],
            depends=["raypipe/kernels/_vector_level.h"],  # its vector-level policy, shared
            # no contraction: Pillow's x86-64 build rounds each multiply and add separately
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "raypipe.kernels._resample",
            ["raypipe/kernels/_resample.c"],
            depends=["raypipe/kernels/_vector_level.h"],  # its vector-level policy, shared
            # no contraction: the filter weights must round as in Pillow's x86-64 build
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        ),
        Extension(
            "raypipe.kernels._colorops",
            ["raypipe/kernels/_colorops.c"],
            depends=["raypipe/kernels/_vector_level.h"],  # its vector-level policy, shared
            # no contraction: the blends and the 3x3 filter must round as in Pillow's x86-64 build
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        ),
    ]
)
