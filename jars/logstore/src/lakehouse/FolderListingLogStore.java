package lakehouse;

import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;

import io.delta.storage.HDFSLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for local disk, with a cheaper {@code listFrom}.
 *
 * <p>Delta finds a table's new commits by listing its {@code _delta_log} folder from a
 * version on, on every snapshot update and commit. Hadoop's local listing builds a file
 * status (a stat and more) for every entry of the folder, which Delta keeps for 30 days of
 * commits: with a commit every few seconds, 0.11-0.18 s a listing at 10,000 entries. Here
 * the folder's names are read first (no stat), and a status is built only for the names
 * from the requested one on, usually the few newest commits. Same answer: the entries whose
 * names sort at or after the requested file's, sorted by name, with the statuses Hadoop's
 * file system gives (hidden files, Hadoop's checksums among them, sort before any
 * version's name, and are left out as Hadoop leaves them out). Writing is Delta's own {@code HDFSLogStore}: an atomic rename that never
 * overwrites.
 */
public class FolderListingLogStore extends HDFSLogStore {

    public FolderListingLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public Iterator<FileStatus> listFrom(Path path, Configuration hadoopConf)
            throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        if (!"file".equals(fs.getUri().getScheme())) {
            return super.listFrom(path, hadoopConf);
        }
        Path folder = path.getParent();
        String first = path.getName();
        List<String> names = new ArrayList<>();
        // The URI's decoded path: a folder's name may hold spaces or any character.
        java.nio.file.Path local = new File(fs.makeQualified(folder).toUri().getPath()).toPath();
        try (DirectoryStream<java.nio.file.Path> entries = Files.newDirectoryStream(local)) {
            for (java.nio.file.Path entry : entries) {
                String name = entry.getFileName().toString();
                if (name.compareTo(first) >= 0 && !isChecksum(fs, name)) {
                    names.add(name);
                }
            }
        } catch (NoSuchFileException missing) {
            throw new FileNotFoundException("No such file or directory: " + folder);
        }
        Collections.sort(names);
        List<FileStatus> statuses = new ArrayList<>(names.size());
        for (String name : names) {
            try {
                statuses.add(fs.getFileStatus(new Path(folder, child(name))));
            } catch (FileNotFoundException gone) {
                // Removed since the folder was read (an expired commit cleaned up): as if
                // the listing had been taken a moment later.
            }
        }
        return statuses.iterator();
    }

    /** Hadoop's local file system hides its own checksum files from a listing. */
    private static boolean isChecksum(FileSystem fs, String name) {
        return fs instanceof ChecksumFileSystem
            && ((ChecksumFileSystem) fs).isChecksumFile(child(name));
    }

    /** A folder entry's name as a relative path, as Hadoop's own listing makes it: read as
     *  a URI, a name holding ':' would be taken for a scheme. */
    private static Path child(String name) {
        return new Path(null, null, name);
    }
}
