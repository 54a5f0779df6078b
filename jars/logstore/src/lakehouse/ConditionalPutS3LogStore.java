package lakehouse;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Arrays;
import java.util.Iterator;

import io.delta.storage.S3SingleDriverLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.AWSBadRequestException;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

/**
 * Delta's log store for S3 (s3a://) that any number of drivers may commit through at once.
 *
 * <p>Delta's own S3 log store ({@code S3SingleDriverLogStore}) makes a commit exclusive only
 * inside one JVM: it checks that the version's file is absent, then writes it, so two
 * drivers (a stream and a reprocess, say) committing the same version both succeed and one
 * commit is lost. Here the commit is a single PUT with {@code If-None-Match: *} (Hadoop's
 * conditional create, S3A since Hadoop 3.5.0): S3 itself refuses the second writer of a
 * version with 412, which Delta receives as the {@code FileAlreadyExistsException} its
 * optimistic concurrency expects, and it retries at the next version. No separate lock
 * service (DynamoDB) is needed: S3 has honoured conditional writes since 2024, as do
 * S3-compatible stores that implement them (MinIO, R2, moto).
 *
 * <p>A 409 answer means another conditional write of the same key was in flight: the write
 * is tried again, and then either that writer won (412) or it failed (this one succeeds).
 * A 412 over an object holding exactly this commit is this write's own, landed with its
 * answer lost: the commit is made. Listing and reading are Delta's own for S3.
 */
public class ConditionalPutS3LogStore extends S3SingleDriverLogStore {

    /** Hadoop's builder option for a create that S3 must refuse if the key exists. */
    static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";
    /** No HEAD or LIST before the PUT: the condition is the check, and it is atomic. */
    static final String NO_PROBES = "fs.s3a.create.performance";
    private static final int CONFLICT_ATTEMPTS = 5;
    private static final long CONFLICT_PAUSE_MS = 200;

    public ConditionalPutS3LogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite,
                      Configuration hadoopConf) throws IOException {
        FileSystem fs = path.getFileSystem(hadoopConf);
        // The actions are read once: kept, so that a write retried after a 409 sends them all.
        StringBuilder content = new StringBuilder();
        while (actions.hasNext()) {
            content.append(actions.next()).append('\n');
        }
        byte[] bytes = content.toString().getBytes(StandardCharsets.UTF_8);
        for (int attempt = 1; ; attempt++) {
            try {
                put(fs, path, bytes, overwrite);
                return;
            } catch (RemoteFileChangedException refused) {  // 412: the version exists
                if (holds(fs, path, bytes)) {
                    // This very write landed and its answer was lost (the SDK sent it
                    // again): the commit is made. Delta would otherwise commit it again
                    // at the next version, and a blind append's rows twice.
                    return;
                }
                FileAlreadyExistsException exists =
                    new FileAlreadyExistsException(path.toString());
                exists.initCause(refused);
                throw exists;
            } catch (AWSBadRequestException conflict) {
                // 409: another conditional write of the key in flight; a 400 is a request
                // this store will never take.
                if (conflict.statusCode() != 409 || attempt == CONFLICT_ATTEMPTS) {
                    throw conflict;
                }
                try {
                    Thread.sleep(CONFLICT_PAUSE_MS * attempt);
                } catch (InterruptedException interrupted) {
                    Thread.currentThread().interrupt();
                    throw new java.io.InterruptedIOException("interrupted committing " + path);
                }
            }
        }
    }

    /** Whether the object at {@code path} holds exactly {@code bytes}: a commit's actions
     *  carry its own time and operation, so another writer's commit never does. */
    private static boolean holds(FileSystem fs, Path path, byte[] bytes) throws IOException {
        try (FSDataInputStream stream = fs.open(path)) {
            return Arrays.equals(stream.readAllBytes(), bytes);
        }
    }

    private static void put(FileSystem fs, Path path, byte[] bytes, boolean overwrite)
            throws IOException {
        FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(overwrite);
        if (!overwrite) {
            builder.must(CONDITIONAL_CREATE, true).opt(NO_PROBES, true);
        }
        // S3 checks the condition when the object is completed, on close.
        try (FSDataOutputStream stream = builder.build()) {
            stream.write(bytes);
        }
    }
}
