//! Real PostgreSQL for tests: the shared server from `scripts/test.sh`, one fresh database per
//! test, or a private server that a test may stop.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use rand::Rng;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, Executor, PgConnection};

use crate::ports::free_port;
use crate::process::{wait_for_tcp, READY_ATTEMPTS};

/// Environment variable holding a superuser URL of the shared PostgreSQL started by `scripts/test.sh`.
pub const SHARED_URL_ENV: &str = "PORTCULLIS_TEST_DATABASE_URL";

/// The project's PostgreSQL migrations, embedded at compile time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// URL of the shared server. Panics with instructions when unset: a Postgres test must never
/// pass silently without Postgres.
pub fn shared_url() -> String {
    std::env::var(SHARED_URL_ENV).unwrap_or_else(|_| {
        panic!("{SHARED_URL_ENV} is not set: run the suite with scripts/test.sh, which starts a real PostgreSQL")
    })
}

/// Creates a database with a random name on the server at `server_url`, applies the project's
/// migrations, and returns the new database's URL. Tests isolate themselves this way instead of
/// truncating shared tables.
pub async fn fresh_database_on(server_url: &str) -> String {
    let name = format!("pc_test_{:016x}", rand::thread_rng().gen::<u64>());
    let mut admin = PgConnection::connect(server_url)
        .await
        .unwrap_or_else(|e| panic!("connect to PostgreSQL at {server_url}: {e}"));
    admin
        .execute(format!("CREATE DATABASE {name}").as_str())
        .await
        .expect("CREATE DATABASE");
    let url = replace_database(server_url, &name);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect to fresh database");
    MIGRATOR.run(&pool).await.expect("apply migrations");
    pool.close().await;
    url
}

/// [`fresh_database_on`] the shared server.
pub async fn fresh_database() -> String {
    fresh_database_on(&shared_url()).await
}

fn replace_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    // postgres://user@host:port/db → keep everything up to the last '/' after the authority.
    let authority_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[authority_end..].find('/') {
        Some(i) => &base[..authority_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// A private PostgreSQL server (initdb on a temp dir, trust auth, loopback only), for tests that
/// restart the database. When running as root it runs through `runuser -u postgres`, because
/// PostgreSQL refuses to run as root.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
}

// === impl PostgresServer ===

impl PostgresServer {
    /// Runs initdb and starts the server; waits (bounded) until it accepts connections.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for postgres");
        let bin = postgres_bin_dir();
        let server = Self {
            port: free_port(),
            dir,
            bin,
        };
        server.chown_to_postgres();
        let status = server
            .as_postgres(&server.bin.join("initdb"))
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(server.data_dir())
            .stdout(Stdio::null())
            .status()
            .expect("run initdb");
        assert!(status.success(), "initdb failed");
        server.pg_ctl_start().await;
        server
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn chown_to_postgres(&self) {
        if is_root() {
            let _ = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(self.dir.path())
                .status();
        }
    }

    fn as_postgres(&self, program: &std::path::Path) -> Command {
        if is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }

    async fn pg_ctl_start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let status = self
            .as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data_dir())
            .args(["-o", &opts, "-w", "-l"])
            .arg(self.dir.path().join("log"))
            .arg("start")
            .stdout(Stdio::null())
            .status()
            .expect("run pg_ctl start");
        assert!(status.success(), "pg_ctl start failed");
        let addr = ([127, 0, 0, 1], self.port).into();
        assert!(
            wait_for_tcp(addr, READY_ATTEMPTS).await,
            "postgres did not start on {addr}"
        );
    }

    /// Superuser URL of the `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server (fast shutdown).
    pub fn stop(&self) {
        let _ = self
            .as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "fast", "-w", "stop"])
            .stdout(Stdio::null())
            .status();
    }

    /// Starts a stopped server again on the same port and data.
    pub async fn start_again(&self) {
        self.pg_ctl_start().await;
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self
            .as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn postgres_bin_dir() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.pop()
        .expect("PostgreSQL binaries under /usr/lib/postgresql/*/bin")
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn replaces_database_name() {
        assert_eq!(
            replace_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            replace_database("postgres://u:p@h:1/db?sslmode=disable", "x"),
            "postgres://u:p@h:1/x?sslmode=disable"
        );
        assert_eq!(replace_database("postgres://h:1", "x"), "postgres://h:1/x");
    }
}
