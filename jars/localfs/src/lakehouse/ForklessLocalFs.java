package lakehouse;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * The local file system of Hadoop's {@code FileContext} ({@code fs.AbstractFileSystem.file.impl},
 * which Spark's checkpoints and Delta's commits write through), on
 * {@link ForklessLocalFileSystem.Raw}: Hadoop's own {@code LocalFs} and {@code RawLocalFs},
 * whose constructors fix the raw file system they use.
 */
public class ForklessLocalFs extends ChecksumFs {

    public ForklessLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
        super(new Raw(conf));
    }

    static class Raw extends DelegateToFileSystem {

        Raw(Configuration conf) throws IOException, URISyntaxException {
            super(FsConstants.LOCAL_FS_URI, new ForklessLocalFileSystem.Raw(), conf,
                  FsConstants.LOCAL_FS_URI.getScheme(), false);
        }

        @Override
        public int getUriDefaultPort() {
            return -1; // file:/// has no port
        }

        @Override
        @Deprecated
        public FsServerDefaults getServerDefaults() throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        public FsServerDefaults getServerDefaults(Path path) throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        public boolean isValidName(String name) {
            return true; // as Hadoop's: the operating system decides
        }
    }
}
