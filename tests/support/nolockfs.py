"""A FUSE file system that refuses file locks, as Lustre mounted with `noflock` does: the folder ROOT seen at
MOUNTPOINT, every file operation passed through, every lock refused with ENOSYS.

    /usr/bin/python3 tests/support/nolockfs.py ROOT MOUNTPOINT    # runs until MOUNTPOINT is unmounted

It runs under Debian's Python with Debian's fusepy (python3-fusepy, on libfuse2: .ci/run installs it), not
in the project's environment: it is a stand-in for the file system only, and mounts a real one through the
kernel's FUSE, whose lock calls reach it (fcntl and flock both, as the kernel asks it for both).
"""

import errno
import os
import sys

from fusepy import FUSE, FuseOSError, Operations


class Passthrough(Operations):
    """ROOT's files at the mount point; locks refused."""

    def __init__(self, root):
        self.root = root

    def _path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path, fh=None):
        st = os.lstat(self._path(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime")
        return {key: getattr(st, key) for key in keys}

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._path(path))]

    def statfs(self, path):
        st = os.statvfs(self._path(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_frsize")
        return {key: getattr(st, key) for key in (*keys, "f_namemax")}

    def access(self, path, mode):
        if not os.access(self._path(path), mode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path, mode):
        os.chmod(self._path(path), mode)

    def chown(self, path, uid, gid):
        os.chown(self._path(path), uid, gid)

    def mkdir(self, path, mode):
        os.mkdir(self._path(path), mode)

    def rmdir(self, path):
        os.rmdir(self._path(path))

    def unlink(self, path):
        os.unlink(self._path(path))

    def rename(self, old, new):
        os.rename(self._path(old), self._path(new))

    def utimens(self, path, times=None):
        os.utime(self._path(path), times)

    def open(self, path, flags):
        return os.open(self._path(path), flags)

    def create(self, path, mode, fi=None):
        return os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        os.truncate(self._path(path), length)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        os.fsync(fh)

    def release(self, path, fh):
        os.close(fh)

    def lock(self, path, fh, cmd, lock):
        raise FuseOSError(errno.ENOSYS)  # what Lustre's noflock answers


if __name__ == "__main__":
    FUSE(Passthrough(sys.argv[1]), sys.argv[2], foreground=True, nothreads=True)
