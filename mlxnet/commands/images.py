"""What the image commands (classify, detect, segment, inpaint) share: many inputs in, one
output per input, the images streamed through the model a batch at a time.

Inputs (:func:`expand_inputs`): each argument is an image file, a folder, a glob pattern or a URL.

- A file is taken as named, whatever its extension; if it is missing or unreadable, that image
  fails on its own.
- A folder is searched recursively, in sorted order, for files whose extension Pillow registers
  for reading; hidden (dot) files and folders are skipped, links to folders are not followed
  (no loops), and the output folder is skipped when it lies inside (a second run does not
  take the first run's outputs as inputs).
- A pattern (an argument that is not an existing path and holds ``*``, ``?`` or ``[``; quote it
  so that mlxnet, not the shell, expands it) is expanded by :func:`glob.glob`, ``**`` matching
  any depth; hidden names, non-image files and the output folder are skipped as in a folder.
- An http(s) URL is downloaded when its batch is read (:mod:`mlxnet.commands.remote`: size and
  time limits, a private folder removed at exit); a failed download fails that image alone. Its
  output is named after the URL's last path segment (made safe; ``_2``... added when two URLs
  end alike). Any other ``scheme://`` argument is an error before any work.
- A folder or pattern that yields no image is an error before any work; a file named twice
  (or by a folder and by name) runs once.

Outputs (:func:`mirror`, :func:`check_outputs`): under an output folder each input's output has
the input's path relative to its folder (or to the pattern's fixed leading folders; a file
argument: its name), so a tree of inputs gives the same tree of outputs. An input whose format
Pillow cannot write gets a ``.png`` output. Before any weights or image is loaded, every output
is checked (writable, a format Pillow writes, never an input file) and two inputs whose outputs
would be the same file are an error.

Running: :mod:`mlxnet.commands.pipeline` (read ahead, batches of one shape, write behind).
"""
from __future__ import annotations

import glob
import json
import os
import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

from mlxnet.commands import grammar
from mlxnet.errors import MlxnetError
from mlxnet.image import is_image_name as _is_image_name
from mlxnet.progress import ProgressBar

Model = TypeVar("Model")
Prepared = TypeVar("Prepared")

_GLOB_CHARS = re.compile(r"[*?[]")


# --- Inputs ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """One input image: ``name`` as messages and reports show it (the argument, or the folder or
    pattern joined with the file's path below it) and ``rel``, where its output goes below an
    output folder."""

    name: str
    rel: Path
    download: Path | None = None  # a URL source (its name is the URL): the file it is fetched to

    @property
    def path(self) -> Path:
        return self.download if self.download is not None else Path(self.name)

    def fetch(self) -> None:
        """Download a URL source, once (a file source is read where it lies)."""
        if self.download is not None and not self.download.exists():
            from mlxnet.commands import remote

            remote.download(self.name, self.download)


def fetched_first(prepare: Callable[["Job"], Prepared]) -> Callable[["Job"], Prepared]:
    """``prepare`` after fetching the job's source: a URL is downloaded with its batch, and a
    failed download fails that image alone, as an unreadable file does. An error about the
    downloaded file names the URL: the temporary file is gone when the user reads it."""
    def fetch_and_prepare(job: "Job") -> Prepared:
        job.source.fetch()
        try:
            return prepare(job)
        except MlxnetError as e:
            if job.source.download is None:
                raise
            raise MlxnetError(str(e).replace(str(job.source.download), job.name)) from None
    return fetch_and_prepare



def is_pattern(arg: str) -> bool:
    """An argument mlxnet expands as a glob: not an existing path (a file may be named ``[1].png``)
    nor a URL (``?`` starts its query), with a wildcard in it."""
    from mlxnet.commands import remote

    return not os.path.lexists(arg) and not remote.has_scheme(arg) and bool(_GLOB_CHARS.search(arg))


def _folder_sources(folder: str, skip: Path | None) -> Iterator[Source]:
    skip_real = os.path.realpath(skip) if skip is not None else None
    # os.walk without followlinks: a link to a parent folder cannot make the walk endless.
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and (skip_real is None or os.path.realpath(os.path.join(root, d)) != skip_real))
        for name in sorted(files):
            if _is_image_name(name):
                full = os.path.join(root, name)
                yield Source(full, Path(os.path.relpath(full, folder)))


def _pattern_base(pattern: str) -> str:
    """The pattern's leading folders without wildcards: matches keep their path below it."""
    parts = Path(pattern).parts[:-1]
    fixed = []
    for part in parts:
        if _GLOB_CHARS.search(part):
            break
        fixed.append(part)
    return os.path.join(*fixed) if fixed else "."


def _inside(path: str, folder_real: str) -> bool:
    """Whether the file ``path`` lies in the folder (its own name is not resolved: a link in
    an input folder to a file elsewhere is still an input)."""
    parent = os.path.realpath(os.path.dirname(path) or ".")
    return parent == folder_real or parent.startswith(folder_real.rstrip(os.sep) + os.sep)


def _pattern_sources(pattern: str, skip: Path | None) -> list[Source]:
    base = _pattern_base(pattern)
    skip_real = os.path.realpath(skip) if skip is not None else None
    matches = sorted(glob.glob(pattern, recursive=True))  # hidden names are not matched by default
    return [Source(m, Path(os.path.relpath(m, base))) for m in matches
            if os.path.isfile(m) and _is_image_name(os.path.basename(m))
            and (skip_real is None or not _inside(m, skip_real))]


def _url_source(url: str, taken: set[str]) -> Source:
    """A URL's source: checked now (http or https), downloaded later, into the run's folder."""
    from mlxnet.commands import remote

    name = remote.unique_name(remote.output_name(remote.check_scheme(url)), taken)
    return Source(url, Path(name), remote.downloads_folder() / name)  # unique among the run's names


def _sources_of(arg: str, skip: Path | None, taken: set[str]) -> list[Source]:
    from mlxnet.commands import remote

    if remote.has_scheme(arg):
        return [_url_source(arg, taken)]
    if os.path.isdir(arg):
        found = list(_folder_sources(arg, skip))
        if not found:
            raise MlxnetError(f"{arg}: no image files in this folder or below it")
        return found
    if is_pattern(arg):
        found = _pattern_sources(arg, skip)
        if not found:
            raise MlxnetError(f"{arg}: no image files match this pattern")
        return found
    return [Source(arg, Path(Path(arg).name))]  # a missing or unreadable file fails on its own, later


def expand_inputs(args: Sequence[str], skip: Path | None = None) -> list[Source]:
    """Every input image of the arguments (files, folders, patterns, URLs), each once, in
    argument order; ``skip``: the output folder, not searched for inputs."""
    sources: list[Source] = []
    seen: set[str] = set()
    rels: set[str] = set()  # output paths taken so far: a URL's name avoids them
    for arg in args:
        for source in _sources_of(arg, skip, rels):
            # a URL named twice is downloaded once
            key = source.name if source.download is not None else os.path.normcase(os.path.abspath(source.name))
            if key not in seen:
                seen.add(key)
                rels.add(os.path.normcase(str(source.rel)))
                sources.append(source)
    return sources


def names_one_file(args: Sequence[str], output: str) -> bool:
    """Whether ``-o`` names the output file itself (the grammar's one-source form): one argument
    that is neither a folder nor a pattern, and an output with an image extension that is not a
    folder (an existing one, or one written with a trailing slash)."""
    from mlxnet.image import readable_extensions

    looks_like_file = (not os.path.isdir(output) and not output.endswith(("/", os.sep))
                       and os.path.splitext(output)[1].lower() in readable_extensions())
    one_source = len(args) == 1 and not os.path.isdir(args[0]) and not is_pattern(args[0])
    if looks_like_file and args and not one_source:
        # Several sources (or a folder or pattern) write one file each into a folder; an output
        # named like an image would silently become a folder of that name.
        what = f"{len(args)} sources write" if len(args) > 1 else f"{args[0]} (a folder or pattern) writes"
        raise MlxnetError(f"-o {output}: {what} one output per image into a folder, but this names an image "
                          f"file; give a folder (for example {os.path.splitext(output)[0]}/), or one source")
    return one_source and looks_like_file


# --- Outputs ---------------------------------------------------------------------------------------

def _writable_format(path: Path) -> bool:
    from mlxnet.image import image_format

    try:
        image_format(path)
    except MlxnetError:
        return False
    return True


def mirror(source: Source, folder: Path) -> Path:
    """The output of ``source`` under ``folder``: its relative path, with ``.png`` for a format
    Pillow reads but cannot write here (or no extension), so one odd file does not stop a run."""
    target = folder / source.rel
    return target if _writable_format(target) else target.with_suffix(".png")


@dataclass(frozen=True)
class Job:
    """One image's work: its source, the other files it reads (a mask) and the files it writes."""

    source: Source
    outputs: tuple[Path, ...] = ()
    also_reads: tuple[Path, ...] = ()

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def reads(self) -> tuple[Path, ...]:
        return (self.source.path, *self.also_reads)


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of an existing file, else None: what two names of one file share."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_outputs(jobs: Sequence[Job]) -> None:
    """Refuse, before any work, two jobs writing one file and an output that is any job's input
    (not only its own: an overlay's ``.mask`` sibling may be another input); then each output
    goes through :func:`mlxnet.image.check_output_path` (format, folder, never over an input)."""
    from mlxnet.image import check_output_path

    writer: dict[str, Job] = {}
    for job in jobs:
        for out in job.outputs:
            key = os.path.normcase(os.path.realpath(out))
            first = writer.setdefault(key, job)
            if first is not job:
                raise MlxnetError(f"{first.name} and {job.name} would both write {out}; "
                                  "rename one or run them separately")
    # One stat per input, then one per output: samefile against every input would be N×M.
    read_by_id: dict[tuple[int, int], Path] = {}
    for job in jobs:
        for path in job.reads:
            found = file_id(path)
            if found is not None:
                read_by_id.setdefault(found, path)
    for job in jobs:
        for out in job.outputs:
            clash = read_by_id.get(file_id(out))  # type: ignore[arg-type]
            check_output_path(out, [*job.reads, *([clash] if clash is not None else [])])


# --- Reporting -------------------------------------------------------------------------------------

def json_line(record: dict) -> str:
    """One JSON Lines record: compact, on one line (json.dumps escapes newlines in strings)."""
    return json.dumps(record)


def _reason(job: Job, error: BaseException) -> str:
    """The error in one line, without the file name that the line already starts with; an
    error other than MlxnetError (a fault, not a finding about the input) keeps its type."""
    text = " ".join(str(error).split())
    if not isinstance(error, MlxnetError):
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    text = text or type(error).__name__
    for prefix in (job.name, str(job.source.path)):
        if text.startswith(prefix + ": "):
            return text[len(prefix) + 2:]
    return text


def report_failure(display: ProgressBar, job: Job, error: BaseException, as_json: bool) -> None:
    """``error: FILE: REASON`` on stderr; with ``--json`` also the JSON Lines record."""
    reason = _reason(job, error)
    display.err(f"error: {job.name}: {reason}")
    if grammar.debugging():  # --debug: where it came from, as the command's own errors show it
        display.err("".join(traceback.format_exception(error)).rstrip())
    if as_json:
        display.out(json_line({"image": job.name, "error": reason}))


def one_line(error: MlxnetError) -> MlxnetError:
    """A weights loader's error (it lists every problem, one a line) as one line: the first,
    with the first problem."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if len(lines) <= 1:
        return error
    return MlxnetError(lines[0].rstrip(":") + f" (first: {lines[1]})")


def load_model(make: Callable[[], Model]) -> Model:
    """The predictor ``make()`` builds, its loader's error in one line."""
    try:
        return make()
    except MlxnetError as e:
        raise one_line(e) from None


def missing_input(job: Job) -> MlxnetError | None:
    """The error for an input argument that names nothing, said as what it was: a name without
    an image extension (``photos/``) may have been meant as a folder. A missing ``x.jpg`` is
    left to the image loader, whose message names an image file."""
    name = job.source.name
    if job.source.download is not None:  # a URL: its download says what went wrong
        return None
    if os.path.lexists(name) or (_is_image_name(os.path.basename(name)) and not name.endswith(("/", os.sep))):
        return None
    return MlxnetError(f"{name}: no such file or folder")
