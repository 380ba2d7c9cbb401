"""Image-folder datasets (``root/<class>/**/<image>``), the layout of torchvision's ImageFolder.

A class is a top-level sub-folder (as torchvision; timm names a class by an image's *leaf* folder,
which is the same for the usual flat ``root/<class>/<image>`` tree). Label indices follow timm by
default: class folders in natural order (``c1, c2, c10``); ``class_order="sorted"`` gives
torchvision's plain sort (``c1, c10, c2``), and a ``class_map`` gives the indices outright (see
``sources.classes``). With a class map, folders it does not name are not listed, as in timm; their
names are kept in ``SourceRows.extra["unmapped_classes"]``.

Files are walked in sorted order, class after class by index, which makes ``sample_id`` (the listing
index) stable across runs and cluster sizes. Directory symlinks that leave the root are not followed;
file symlinks are listed and refused (``outside_root``) by the reader, before they are opened, so they
are counted. A file name that is not UTF-8 is listed and read like any other (its bytes travel in the
path column, see ``paths.path_value``); reports show it with ``\\xNN`` escapes.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs

from raypipe.sources.classes import classes_by_index, load_class_map, order_classes
from raypipe.sources.formats.parquet import parquet_files
from raypipe.sources.table import SourceRows, listed_stamp, make_rows
from raypipe.sources.transport.paths import DatasetRoot, path_value, printable
from raypipe.sources.transport.remote import ReadOptions, with_retries

__all__ = ["IMG_EXTENSIONS", "list_image_folder", "list_remote"]

# torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively like torchvision does.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def _inside(root_real: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def _walk_local(root: DatasetRoot, class_dir: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True):
        # Prune (in place, which os.walk honours) directory links that escape the root or loop.
        dirnames[:] = sorted(d for d in dirnames if _inside(root.root, os.path.join(dirpath, d)))
        for name in sorted(filenames):
            if _is_image(name):
                out.append(os.path.relpath(os.path.join(dirpath, name), root.root))
    return out


def _classes_local(root: DatasetRoot) -> list[str]:
    with os.scandir(root.root) as it:
        return [e.name for e in it if e.is_dir() and _inside(root.root, e.path)]


def _walk_order(relpath: str) -> list[tuple[int, str]]:
    """Sort key reproducing a sorted top-down os.walk: a folder's files, then its sub-folders in order."""
    *dirs, name = relpath.split("/")
    return [(1, d) for d in dirs[1:]] + [(0, name)]


def list_remote(
    root: DatasetRoot, options: ReadOptions | None = None
) -> tuple[list[str], dict[str, list[str]], dict[str, tuple[int, int]]]:
    """Class names, each class's files, and each file's (size, mtime_ns) as the listing gives them.

    A store lists a prefix 1,000 keys a page, each page after the last one's answer: 1.28M objects under
    one prefix are 1,282 requests in turn. So the root's class prefixes are listed first (one delimited
    listing), then each class's objects, ``options.list_in_flight`` prefixes at once, each listing retried
    as reads are (``remote.with_retries``). ``list_in_flight=1`` lists the whole folder in one recursive
    listing instead. Either way the result is the same.
    """
    options = options or ReadOptions()
    fs = root.filesystem

    def listing(path: str, recursive: bool) -> list[pafs.FileInfo]:
        return with_retries(lambda: fs.get_file_info(pafs.FileSelector(path, recursive=recursive)), options)

    if options.list_in_flight == 1:
        return _gathered(root, listing(root.root, True))
    top = listing(root.root, False)
    prefixes = [info.path for info in top if info.type == pafs.FileType.Directory]
    with ThreadPoolExecutor(max(1, min(options.list_in_flight, len(prefixes))), "raypipe-list") as pool:
        below = list(pool.map(lambda path: listing(path, True), prefixes))  # pyarrow waits without the GIL
    return _gathered(root, itertools.chain(top, *below))


def _gathered(root: DatasetRoot, infos) -> tuple[list[str], dict[str, list[str]], dict[str, tuple[int, int]]]:
    """``list_remote``'s result from the listed entries under the root (in any order)."""
    classes: set[str] = set()
    files: dict[str, list[str]] = {}
    stamps: dict[str, tuple[int, int]] = {}
    for info in infos:
        rel = root.relative(info.path)
        parts = rel.split("/")
        if info.type == pafs.FileType.Directory and len(parts) == 1:
            classes.add(parts[0])
        elif info.type == pafs.FileType.File and len(parts) >= 2 and _is_image(parts[-1]):
            classes.add(parts[0])
            files.setdefault(parts[0], []).append(rel)
            stamps[rel] = listed_stamp(info)
    for c in files:
        files[c].sort(key=_walk_order)
    return list(classes), files, stamps


def list_image_folder(root: DatasetRoot, *, class_order: str = "natural", class_map=None) -> SourceRows:
    """List an ImageFolder tree into SourceRows; raises ValueError if it has no class folders.

    ``class_order``: "natural" (timm's, default) or "sorted" (torchvision's); ``class_map``: a dict
    ``{folder name: index}`` or a .txt/.json/.csv file (``sources.classes.load_class_map``).
    """
    order_classes([], class_order)  # validates class_order before any listing
    mapping = load_class_map(class_map, root.root if root.is_local else None) if class_map is not None else None
    if root.is_local:
        if not os.path.isdir(root.root):
            raise ValueError(f"image folder {root.uri!r} is not a directory")
        found_classes = _classes_local(root)
        per_class, stamps = None, {}  # not known without a stat per file, which the cache never needs
    else:
        found_classes, per_class, stamps = list_remote(root)
    if not found_classes:
        raise ValueError(f"image folder {root.uri!r} has no class sub-folders (expected root/<class>/<image>)")
    extra = {}
    if mapping is None:
        classes = order_classes(found_classes, class_order)
        index = {c: i for i, c in enumerate(classes)}
    else:
        index = {c: mapping[c] for c in found_classes if c in mapping}
        unmapped = order_classes([c for c in found_classes if c not in mapping], class_order)
        if not index:
            raise ValueError(f"image folder {root.uri!r}: none of its class folders is in class_map ({unmapped[:5]})")
        if unmapped:
            extra["unmapped_classes"] = tuple(printable(c) for c in unmapped)
        classes = list(classes_by_index(mapping))
    if per_class is None:
        per_class = {c: _walk_local(root, os.path.join(root.root, c)) for c in index}
    paths: list[str] = []
    labels: list[int] = []
    # files in class order (by index), so sample_id follows the labels as it did with plain sorting
    for c in sorted(index, key=index.__getitem__):
        found = per_class.get(c, [])
        paths.extend(found)
        labels.extend([index[c]] * len(found))
    if not paths:
        exts = ", ".join(IMG_EXTENSIONS)
        hint = ""
        parquet = sorted({os.path.dirname(p) for p in parquet_files(root, single_file=False)}) if root.is_local else []
        if parquet:  # e.g. a Hugging Face dataset: root/data/train-00000-of-00004.parquet (and other splits)
            hint = f"; it holds Parquet files in {parquet[:3]}: give one split's file or folder (or --kind parquet)"
        raise ValueError(f"image folder {root.uri!r} has no image files ({exts}) under its class folders{hint}")
    unknown = (-1, -1)
    object_sizes = [stamps.get(p, unknown)[0] for p in paths]
    object_mtimes = [stamps.get(p, unknown)[1] for p in paths]
    # file names that are not UTF-8 travel as their bytes (path_value); class names are only shown
    paths = [path_value(p) for p in paths]
    table = make_rows(paths, labels, object_sizes=object_sizes, object_mtimes=object_mtimes)
    return SourceRows(kind="folder", root=root, table=table, classes=tuple(printable(c) for c in classes), extra=extra)
