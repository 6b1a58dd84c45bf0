"""A dynamic class's ``mkfsOptions``, read as ``mke2fs`` and ``mkfs.xfs`` read them, and the
options refused before any volume is made with them.

Both tools read their options with getopt: single letters, flags bundled (``-qj``), an
argument attached (``-m0``) or in the next word, and any word that is not an option taken as
the device (or, for mke2fs, the block count). The image is the device, so a class may give
options only. Which letters exist, and which take an argument, differs between the two; so
does their meaning (``-n`` is mke2fs's dry run and mkfs.xfs's naming options, ``-N`` is
mkfs.xfs's dry run and mke2fs's inode count). Options are therefore read per ``fsType``.

Refused, each with its reason (:func:`options_problem`):

- what makes no filesystem, or puts it where no mount looks: dry runs, ``-V``, mke2fs ``-S``,
  ``-E offset=``, ``-E android_sparse``, ``-O journal_dev``, mkfs.xfs ``-d size|name|file``;
- what overrides what localpv chooses: the UUID (``-U``, ``-m uuid=``: the image's identity,
  recorded in its PV), a second ``-F`` (mke2fs then formats even a mounted image), ``-t``
  (the class's fsType), a label (shared by every volume of the class), ``-E discard`` in a
  thick class (localpv makes thick images with ``nodiscard``: discards punch holes);
- what reads the agent's container into tenants' volumes or hangs them on a node's device:
  ``-d`` (mke2fs), ``-p``, ``-c`` (mkfs.xfs), ``-l``, ``-z``, external journals, logs and
  realtime devices;
- fewer inodes than mke2fs itself gives the smallest image (``-N`` below 1024);
- the other filesystem's options, and arguments of the other tool's shape (``-m 0`` in an
  XFS class, ``-i size=512`` in an ext4 one).

Repeating what localpv passes anyway and that changes nothing (``-q``, mkfs.xfs ``-f``,
``-K``, ``-E nodiscard``) is accepted. What this table does not know (an XFS sub-option of a
newer mkfs.xfs, a value out of range) is left to mkfs: ``localpv config check`` tries the
options on a scratch image, and a create whose image does not hold the filesystem fails.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from localpv.naming import quote_text

#: Fewer inodes than this is refused: what mke2fs gives the smallest image localpv makes
#: (4 MiB), on which a handful of files fill the filesystem whatever room is left.
MIN_INODES = 1024

_LABEL = ("a label would be shared by every volume of the class, and /dev/disk/by-label would name whichever "
          "was attached last: an fstab entry by LABEL= could mount a tenant's volume")
_UUID = "the filesystem UUID is localpv's: the image's identity, recorded in its PV and checked at every stage"
_NODE_DEVICE = "{what} on a device of the node is not part of the image: the volume would depend on it"


@dataclass(frozen=True)
class Tool:
    """One mkfs program's option letters: which take an argument, and which are refused and why."""

    name: str
    flags: str
    with_argument: str
    refused: dict[str, str]
    #: letters whose argument is a number
    numeric: str = ""
    #: letters whose argument is a comma-separated list of sub-options (or features)
    suboptions: str = ""
    #: whether each sub-option must look like ``key`` or ``key=value`` (mkfs.xfs's are; mke2fs's
    #: features are spelled ``^name`` too)
    keyed_suboptions: bool = False
    #: sub-options (or features) refused, per letter: {letter: {name: reason}}
    refused_suboptions: dict[str, dict[str, str]] = field(default_factory=dict)

    def knows(self, letter: str) -> bool:
        return letter in self.flags or letter in self.with_argument


MKE2FS = Tool(
    name="mkfs.ext4",
    # from mke2fs's getopt string (e2fsprogs 1.47): "b:cd:e:g:i:jl:m:no:qr:s:t:vC:DE:FG:I:J:KL:M:N:O:R:ST:U:Vz:"
    flags="cjnqvDFKSV",
    with_argument="bdegilmorstCEGIJLMNORTUz",
    numeric="bgimCGIN",
    suboptions="EJO",
    refused={
        "n": "a dry run: mke2fs writes nothing, and each claim would get an image without a filesystem",
        "V": "mke2fs prints its version and makes no filesystem",
        "S": "mke2fs writes superblocks and group descriptors only, no usable filesystem",
        "F": "localpv passes -F itself, and a second -F makes mke2fs format even a mounted image",
        "U": _UUID,
        "L": _LABEL,
        "t": "the class's fsType says which filesystem is made",
        "d": "mke2fs would copy that directory of the agent's container into every volume",
        "z": "mke2fs would write an undo file into the agent's container at every create",
        "l": "mke2fs would read a bad-block list from a file of the agent's container; bad blocks are the pool "
             "disk's",
        "c": "a bad-block scan reads (with -c -c writes) the whole image at every create; bad blocks are the pool "
             "disk's",
        "R": "-R is mke2fs's old spelling of -E: spell it -E",
    },
    refused_suboptions={
        "E": {"offset": "the filesystem would start {value} bytes into the image, where no mount looks for it",
              "android_sparse": "mke2fs would write an Android sparse image, not a filesystem"},
        "O": {"journal_dev": "mke2fs would make an external journal, not a filesystem"},
        "J": {"device": _NODE_DEVICE.format(what="an external journal")},
    },
)

MKFS_XFS = Tool(
    name="mkfs.xfs",
    # from mkfs.xfs's getopt string (xfsprogs 6.1), without its undocumented -C
    flags="KNqfV",
    with_argument="bcdilLmnprs",
    suboptions="bdilmnrs",
    keyed_suboptions=True,
    refused={
        "N": "a dry run: mkfs.xfs prints the geometry and writes nothing, and each claim would get an image "
             "without a filesystem",
        "V": "mkfs.xfs prints its version and makes no filesystem",
        "L": _LABEL,
        "p": "mkfs.xfs would copy the files a prototype file of the agent's container names into every volume",
        "c": "mkfs.xfs would read options from a file of the agent's container, which the ConfigMap does not show",
    },
    refused_suboptions={
        "d": {"size": "the data section is the whole image: its size is the claim's",
              "name": "the image is the data section", "file": "the image is the data section"},
        "m": {"uuid": _UUID},
        "l": {"logdev": _NODE_DEVICE.format(what="an external log"),
              "name": _NODE_DEVICE.format(what="an external log"), "file": _NODE_DEVICE.format(what="an external log")},
        "r": {"rtdev": _NODE_DEVICE.format(what="a realtime section"),
              "name": _NODE_DEVICE.format(what="a realtime section"),
              "file": _NODE_DEVICE.format(what="a realtime section")},
    },
)

TOOLS = {"ext4": MKE2FS, "xfs": MKFS_XFS}
_NUMBER = re.compile(r"-?\d+(\.\d+)?")
_SUBOPTION = re.compile(r"[a-z][a-z0-9_-]*(=[^,=]*)?")

Word = tuple[str, str | None]


class MkfsOptionsError(ValueError):
    """mkfs options that cannot be read: the message is "expected ..., got ..."."""


def split_options(fs_type: str, text: str) -> list[Word]:
    """The options of ``text`` as getopt reads them for ``fs_type``'s mkfs: (letter, argument or
    None) in order. MkfsOptionsError for unclosed quotes, a word that is not an option, a
    letter the tool does not have, or an option missing its argument."""
    tool, other = TOOLS[fs_type], TOOLS["xfs" if fs_type == "ext4" else "ext4"]
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise MkfsOptionsError(f"expected mkfs options with their quotes closed, got {quote_text(text)} ({err})"
                               ) from err
    found: list[Word] = []
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("-") or word in ("-", "--"):
            raise MkfsOptionsError(f"expected options only (the image is the device), got {quote_text(word)}")
        for at, letter in enumerate(word[1:], start=1):
            if not tool.knows(letter):
                whose = f"an option of {other.name}" if other.knows(letter) else "which is none"
                raise MkfsOptionsError(f"expected options of {tool.name} (fsType {fs_type}), got -{letter}, "
                                       f"{whose}")
            if letter in tool.flags:
                found.append((letter, None))
                continue
            argument = word[at + 1:]
            if not argument:
                if index == len(words):
                    raise MkfsOptionsError(f"expected a value after -{letter}, got nothing")
                argument = words[index]
                index += 1
            found.append((letter, argument))
            break
    return found


def _suboptions(argument: str) -> list[tuple[str, str | None]]:
    """``key=value,flag`` into its (name, value or None) pairs, as both tools split them."""
    pairs: list[tuple[str, str | None]] = []
    for item in argument.split(","):
        name, sep, value = item.partition("=")
        pairs.append((name, value if sep else None))
    return pairs


def _word_problem(tool: Tool, provisioning: str, letter: str, argument: str | None) -> str | None:
    """What is wrong with one option (the expected-part of a message), or None."""
    if letter in tool.refused:
        return f"no -{letter} ({tool.refused[letter]})"
    if argument is None:
        return None
    if letter in tool.numeric and not _NUMBER.fullmatch(argument):
        return f"-{letter} with a number, got -{letter} {argument}"
    if letter == "N" and tool is MKE2FS and float(argument) < MIN_INODES:
        return (f"-N of at least {MIN_INODES} inodes (what mke2fs gives the smallest image, 4 MiB; -i scales with "
                f"the claim's size instead)")
    if letter not in tool.suboptions:
        return None
    if tool.keyed_suboptions and not all(_SUBOPTION.fullmatch(item) for item in argument.split(",")):
        return f"-{letter} with {tool.name} sub-options (key=value,...), got -{letter} {argument}"
    for name, value in _suboptions(argument):
        if letter == "E" and name == "discard" and provisioning == "thick":
            return ("no -E discard in a thick class (discarding punches holes into the image and makes it sparse "
                    "again; localpv makes thick images with nodiscard)")
        reason = tool.refused_suboptions.get(letter, {}).get(name)
        if reason is not None:
            spelled = f"-{letter} {name}=" if value is not None else f"-{letter} {name}"
            return f"no {spelled} ({reason.format(value=value if value is not None else 'some')})"
    return None


def options_problem(fs_type: str, provisioning: str, text: str) -> str | None:
    """Why ``text`` is not acceptable as the mkfsOptions of a class of ``fs_type`` and
    ``provisioning`` ("expected ..., got ..."), or None when it is."""
    try:
        words = split_options(fs_type, text)
    except MkfsOptionsError as err:
        return str(err)
    tool = TOOLS[fs_type]
    for letter, argument in words:
        if (expected := _word_problem(tool, provisioning, letter, argument)) is not None:
            return f"expected {expected}" if ", got " in expected else f"expected {expected}, got {quote_text(text)}"
    return None
