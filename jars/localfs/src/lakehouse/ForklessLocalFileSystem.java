package lakehouse;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's local file system ({@code fs.file.impl}), without a process per rename and per
 * file created.
 *
 * <p>Without Hadoop's native library (which Spark does not ship), {@link RawLocalFileSystem}
 * runs a {@code readlink} process to tell whether a path is a symbolic link, which
 * {@code FileContext} asks of both sides of every rename (Spark's checkpoint files and
 * Delta's commits are renamed into place, and their checksum files too), and a
 * {@code chmod} process for every file and folder it creates with a permission. A cold
 * {@code lakehouse stream --available-now} of 600 events started 1,136 of them, 2-3 ms
 * each on the committing thread. The same answers come from the JDK: whether the path is a
 * link, and the permission bits set with {@link Files#setPosixFilePermissions}. A symbolic
 * link, a sticky bit (which the JDK cannot set), or Hadoop's native library present go to
 * Hadoop's own code.
 */
public class ForklessLocalFileSystem extends LocalFileSystem {

    public ForklessLocalFileSystem() {
        super(new Raw());
    }

    /** The raw (unchecksummed) file system, for {@code ForklessLocalFs} too. */
    public static class Raw extends RawLocalFileSystem {

        @Override
        public FileStatus getFileLinkStatus(Path path) throws IOException {
            // Hadoop's answer for anything but a link: the path's own status (or its
            // FileNotFoundException), which its getFileStatus gives without a process.
            if (Files.isSymbolicLink(pathToFile(path).toPath())) {
                return super.getFileLinkStatus(path);
            }
            return getFileStatus(path);
        }

        @Override
        public void setPermission(Path path, FsPermission permission) throws IOException {
            if (NativeIO.isAvailable() || permission.getStickyBit()) {
                super.setPermission(path, permission);
                return;
            }
            Files.setPosixFilePermissions(pathToFile(path).toPath(), posix(permission.toShort()));
        }
    }

    // The nine permission bits, owner's read first, as PosixFilePermission declares them.
    private static final PosixFilePermission[] BITS_FROM_HIGHEST = PosixFilePermission.values();

    static Set<PosixFilePermission> posix(short mode) {
        Set<PosixFilePermission> permissions = EnumSet.noneOf(PosixFilePermission.class);
        for (int i = 0; i < BITS_FROM_HIGHEST.length; i++) {
            if ((mode & (1 << (BITS_FROM_HIGHEST.length - 1 - i))) != 0) {
                permissions.add(BITS_FROM_HIGHEST[i]);
            }
        }
        return permissions;
    }
}
