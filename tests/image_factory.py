"""Small encoded images for tests: real photos (raypipe's shipped sample photos), odd modes and formats, bad data.

Every function returns ``bytes``; nothing is downloaded. Reused by the kernel and pipeline tests.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zlib
from functools import cache

import numpy as np
from PIL import Image

from raypipe.testing.fields import ByteTokens

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


@cache
def photo(name: str = "astronaut", size: tuple[int, int] = (500, 375)) -> np.ndarray:
    """A real photo shipped with raypipe (``raypipe.sample_data.PHOTOS``), resized to ``size`` (W, H),
    as HxWx3 uint8."""
    from raypipe.sample_data import load_photo

    return np.asarray(load_photo(name).resize(size, Image.BICUBIC))


def encode(img: Image.Image | np.ndarray, fmt: str = "JPEG", **kwargs) -> bytes:
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img)
    buf = io.BytesIO()
    if fmt == "JPEG":
        kwargs.setdefault("quality", 90)
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def photo_jpeg(name: str = "astronaut", size: tuple[int, int] = (500, 375), quality: int = 90) -> bytes:
    return encode(photo(name, size), "JPEG", quality=quality)


def gradient(size: tuple[int, int] = (64, 48)) -> np.ndarray:
    """Pixels that are a function of position (W, H): exact checks without a photo."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    planes = [x * 255 // max(1, w - 1), y * 255 // max(1, h - 1), (x + y) % 256]
    return np.stack(planes, axis=2).astype(np.uint8)


# ---- bad data --------------------------------------------------------------------------------


def empty() -> bytes:
    return b""


def truncated_jpeg() -> bytes:
    data = photo_jpeg("chelsea")
    return data[: len(data) // 2]


def random_bytes(n: int = 4096, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def text_bytes() -> bytes:
    return b"name,label\ncat.jpg,3\n" * 50


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(kind + body) & 0xFFFFFFFF
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def huge_png(width: int = 20000, height: int = 20000) -> bytes:
    """A PNG whose (valid, CRC-checked) IHDR claims ``width`` x ``height`` RGB; the data is tiny."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    chunks = _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + chunks


# ---- modes and formats ---------------------------------------------------------------------------


def cmyk_jpeg() -> bytes:
    return encode(Image.fromarray(photo("coffee", (200, 150))).convert("CMYK"), "JPEG")


def gray(fmt: str = "JPEG") -> bytes:
    return encode(Image.fromarray(photo("chelsea", (200, 150))).convert("L"), fmt)


def palette_png(transparency: bool = False) -> bytes:
    im = Image.fromarray(photo("astronaut", (160, 120))).convert("P", palette=Image.ADAPTIVE, colors=64)
    if transparency:
        return encode(im, "PNG", transparency=0)
    return encode(im, "PNG")


def alpha_png(mode: str = "RGBA") -> bytes:
    """RGBA or LA with a varying alpha channel."""
    im = Image.fromarray(photo("rocket", (120, 160))).convert(mode[:-1] if mode != "RGBA" else "RGB")
    alpha = Image.fromarray(gradient((120, 160))[:, :, 0])
    im.putalpha(alpha)
    return encode(im, "PNG")


def png16(values: np.ndarray) -> bytes:
    """A 16-bit greyscale PNG holding ``values`` (uint16 HxW)."""
    return encode(Image.fromarray(values.astype(np.uint16)), "PNG")


def exif_jpeg(orientation: int, size: tuple[int, int] = (90, 60)) -> bytes:
    """A photo JPEG (stored W x H = ``size``) tagged with EXIF ``orientation``."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(photo("chelsea", size), "JPEG", quality=95, exif=exif.tobytes())


def broken_exif_jpeg() -> bytes:
    """A JPEG whose APP1 'Exif' segment points its IFD past the end of the block."""
    data = encode(gradient((64, 48)), "JPEG")
    body = b"Exif\x00\x00" + b"MM\x00\x2a\xff\xff\xff\x00" + b"\x00" * 6
    app1 = b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body
    return data[:2] + app1 + data[2:]


def other_format(fmt: str) -> bytes:
    """The astronaut in WebP, BMP, TIFF or PPM; PGM is greyscale (Pillow writes PPM/PGM by mode)."""
    im = Image.fromarray(photo("astronaut", (120, 90)))
    if fmt == "PGM":
        return encode(im.convert("L"), "PPM")
    if fmt == "WEBP":
        return encode(im, "WEBP", lossless=True)
    return encode(im, fmt)


def tar_bytes(members) -> bytes:
    """An uncompressed tar archive of ``(name, data)`` members, in order (a WebDataset shard)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_shard(path, members, *, fmt=tarfile.PAX_FORMAT):
    """A tar shard of ``(name, bytes)`` members, in order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def sample(key, label, image=None, ext="jpg"):
    """The members of one WebDataset sample: its image (by default bytes naming the key) and its .cls."""
    out = [(f"{key}.{ext}", image if image is not None else f"img:{key}".encode())]
    return out + ([(f"{key}.cls", str(label).encode())] if label is not None else [])


def captioned_jpeg(i: int) -> bytes:
    """A small JPEG whose gray level is a function of ``i``."""
    return encode(np.full((24, 30, 3), (i * 10) % 250, np.uint8))


def write_captioned_shards(root, n: int = 12, per_shard: int = 5, *, without_txt=(), bad_json=()) -> None:
    """Shards of ``KEY.jpg`` + ``KEY.cls`` + ``KEY.txt`` (``caption i``) + ``KEY.json`` (``{"i": i}``)."""
    for s in range(0, n, per_shard):
        members = []
        for i in range(s, min(n, s + per_shard)):
            key = f"k{i:04d}"
            members += sample(key, i % 3, image=captioned_jpeg(i))
            if i not in without_txt:
                members.append((f"{key}.txt", f"caption {i}".encode()))
            members.append((f"{key}.json", b"{oops" if i in bad_json else json.dumps({"i": i}).encode()))
        write_shard(root / f"shard-{s // per_shard:04d}.tar", members)


# A field transform the tests' workers can import (``raypipe.testing``): one that lived here would not
# unpickle in a Ray worker, which does not have the tests' folder on its path.
caption_ids = ByteTokens(16)
