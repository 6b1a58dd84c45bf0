"""A dynamic class's mkfsOptions, read as mke2fs and mkfs.xfs read them (issue 23): what makes
no filesystem, puts it elsewhere, overrides what localpv chooses, reads the agent's files into
tenants' volumes, or belongs to the other filesystem is refused, one line saying why."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpv.config.mkfs import MkfsOptionsError, options_problem, split_options

ACCEPTED = [
    ("ext4", "thin", ""),
    ("ext4", "thin", "-m 0"),
    ("ext4", "thin", "-m0 -q"),                       # an attached argument, a repeat of localpv's own -q
    ("ext4", "thin", "-T largefile -i 65536 -I 256 -b 4096"),
    ("ext4", "thin", "-N 1024"),
    ("ext4", "thin", "-O ^has_journal,metadata_csum -E lazy_itable_init=0,root_owner=1000:1000"),
    ("ext4", "thin", "-J size=8 -e remount-ro -M /data -o Linux -j -v -D"),
    ("ext4", "thick", "-E nodiscard -K"),             # what localpv does for a thick class anyway
    ("ext4", "thin", "-E discard"),                   # a thin image is sparse already
    ("ext4", "thin", "-m 1.5"),
    ("xfs", "thin", ""),
    ("xfs", "thin", "-m crc=1,finobt=1 -i size=512 -n ftype=1 -l size=16m -b size=4096 -s size=4096"),
    ("xfs", "thin", "-d agcount=4,su=64k,sw=2 -q -f -K"),  # -f and -K repeat what localpv passes
    ("xfs", "thick", "-m reflink=0 -l internal,lazy-count=1"),
    ("xfs", "thin", "-m newthing=1"),                 # a sub-option this table does not know: mkfs decides
]


@pytest.mark.parametrize(("fs", "provisioning", "options"), ACCEPTED)
def test_options_that_make_a_filesystem_are_accepted(fs: str, provisioning: str, options: str) -> None:
    assert options_problem(fs, provisioning, options) is None


REFUSED = [
    # nothing made, or made elsewhere
    ("ext4", "thin", "-n", 'expected no -n (a dry run: mke2fs writes nothing'),
    ("ext4", "thin", "-m 0 -V", "expected no -V (mke2fs prints its version and makes no filesystem)"),
    ("ext4", "thin", "-S", "expected no -S (mke2fs writes superblocks and group descriptors only"),
    ("ext4", "thin", "-E offset=1048576", "expected no -E offset= (the filesystem would start 1048576 bytes"),
    ("ext4", "thin", "-E android_sparse", "expected no -E android_sparse (mke2fs would write an Android sparse"),
    ("ext4", "thin", "-O journal_dev", "expected no -O journal_dev (mke2fs would make an external journal"),
    ("xfs", "thin", "-N", "expected no -N (a dry run: mkfs.xfs prints the geometry and writes nothing"),
    ("xfs", "thin", "-V", "expected no -V (mkfs.xfs prints its version and makes no filesystem)"),
    ("xfs", "thin", "-d size=1g", "expected no -d size= (the data section is the whole image"),
    ("xfs", "thin", "-d name=/dev/sda", "expected no -d name= (the image is the data section"),
    ("xfs", "thin", "-d file", "expected no -d file (the image is the data section"),
    # too few inodes
    ("ext4", "thin", "-N 16", "expected -N of at least 1024 inodes (what mke2fs gives the smallest image"),
    # what localpv chooses
    ("ext4", "thin", "-U 0b1c2d3e-0000-4000-8000-000000000001", "expected no -U (the filesystem UUID is "
                                                                "localpv's"),
    ("xfs", "thin", "-m crc=1,uuid=0b1c2d3e-0000-4000-8000-000000000001",
     "expected no -m uuid= (the filesystem UUID is localpv's"),
    ("ext4", "thin", "-L data", "expected no -L (a label would be shared by every volume of the class"),
    ("xfs", "thin", "-L data", "expected no -L (a label would be shared by every volume of the class"),
    ("ext4", "thin", "-F", "expected no -F (localpv passes -F itself, and a second -F makes mke2fs format even a "
                           "mounted image)"),
    ("ext4", "thin", "-qF", "expected no -F"),
    ("ext4", "thin", "-t ext2", "expected no -t (the class's fsType says which filesystem is made)"),
    ("ext4", "thick", "-E lazy_itable_init=0,discard", "expected no -E discard in a thick class (discarding punches "
                                                       "holes into the image"),
    # the agent's container in tenants' volumes, or the node's devices under them
    ("ext4", "thin", "-d /var/run/secrets", "expected no -d (mke2fs would copy that directory of the agent's "
                                            "container into every volume"),
    ("ext4", "thin", "-z /tmp/undo", "expected no -z (mke2fs would write an undo file"),
    ("ext4", "thin", "-l /tmp/badblocks", "expected no -l (mke2fs would read a bad-block list"),
    ("ext4", "thin", "-c", "expected no -c (a bad-block scan reads"),
    ("ext4", "thin", "-J device=/dev/sdb", "expected no -J device= (an external journal on a device of the node"),
    ("xfs", "thin", "-p /etc/proto", "expected no -p (mkfs.xfs would copy the files a prototype file of the agent's "
                                     "container names into every volume"),
    ("xfs", "thin", "-c options=/etc/mkfs.conf", "expected no -c (mkfs.xfs would read options from a file of the "
                                                 "agent's container"),
    ("xfs", "thin", "-l logdev=/dev/sdb", "expected no -l logdev= (an external log on a device of the node"),
    ("xfs", "thin", "-r rtdev=/dev/sdb", "expected no -r rtdev= (a realtime section on a device of the node"),
    # the other filesystem's options
    ("xfs", "thin", "-E lazy_itable_init=0", "expected options of mkfs.xfs (fsType xfs), got -E, an option of "
                                             "mkfs.ext4"),
    ("xfs", "thin", "-m 0", 'expected -m with mkfs.xfs sub-options (key=value,...), got -m 0'),
    ("ext4", "thin", "-i size=512", "expected -i with a number, got -i size=512"),
    ("ext4", "thin", "-f", "expected options of mkfs.ext4 (fsType ext4), got -f, an option of mkfs.xfs"),
    ("ext4", "thin", "-n size=8192", 'expected options only (the image is the device), got "size=8192"'),
    ("xfs", "thin", "-Z", "expected options of mkfs.xfs (fsType xfs), got -Z, which is none"),
    # shape
    ("ext4", "thin", "-m", "expected a value after -m, got nothing"),
    ("ext4", "thin", "-m 0 /dev/sda", 'expected options only (the image is the device), got "/dev/sda"'),
    ("ext4", "thin", "-- -m 0", 'expected options only (the image is the device), got "--"'),
    ("ext4", "thin", "-m '0", "expected mkfs options with their quotes closed"),
]


@pytest.mark.parametrize(("fs", "provisioning", "options", "expected"), REFUSED)
def test_options_that_make_a_bad_volume_are_refused_saying_why(fs: str, provisioning: str, options: str,
                                                                expected: str) -> None:
    problem = options_problem(fs, provisioning, options)
    assert problem is not None and problem.startswith(expected), problem
    assert ", got " in problem and "\n" not in problem


def test_split_reads_options_as_getopt_does() -> None:
    assert split_options("ext4", "-m0 -qj -b 4096 -E a=1 -E b=2") == [
        ("m", "0"), ("q", None), ("j", None), ("b", "4096"), ("E", "a=1"), ("E", "b=2")]
    assert split_options("xfs", "-l internal -Kq -m crc=1") == [("l", "internal"), ("K", None), ("q", None),
                                                                  ("m", "crc=1")]
    with pytest.raises(MkfsOptionsError):
        split_options("xfs", "-E x")


_ext4_word = st.sampled_from(["-m 0", "-m 5", "-q", "-j", "-T small", "-i 8192", "-I 256", "-b 4096", "-O ^64bit",
                              "-E lazy_itable_init=0", "-e continue", "-N 2048", "-D", "-v"])


@given(st.lists(_ext4_word, max_size=6))
def test_any_combination_of_accepted_words_is_accepted_and_split_back(words: list[str]) -> None:
    text = " ".join(words)
    assert options_problem("ext4", "thin", text) is None
    split = split_options("ext4", text)
    assert [f"-{letter}" + (f" {arg}" if arg is not None else "") for letter, arg in split] == [
        " ".join(shlex.split(w)) for w in words]


@given(fs=st.sampled_from(["ext4", "xfs"]), provisioning=st.sampled_from(["thin", "thick"]),
       text=st.text(alphabet=" -=,'\"\\abcdefmnqsuvxyzADEFJKLMNOSTUV0123456789./^", max_size=30))
def test_any_text_is_read_or_refused_in_one_line(fs: str, provisioning: str, text: str) -> None:
    problem = options_problem(fs, provisioning, text)
    assert problem is None or (problem.startswith("expected ") and ", got " in problem and "\n" not in problem)
