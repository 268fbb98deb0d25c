//! The directory source passes lockgate's connector conformance suite.

use lockgate::connector::SourceSpec;
use lockgate::testkit::conformance::source::{SourceFixture, SourceTestContext};
use lockgate::testkit::conformance::source_from_section;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

/// Each fixture is a directory of `splits` files, `f-0` ... , read through the job
/// file's `[source.dir]` section.
struct Context(tempfile::TempDir);

struct Fixture {
    dir: PathBuf,
    written: usize,
}

impl SourceTestContext for Context {
    /// This crate's `lockgate-dir`: the command line with `[source.dir]` registered.
    fn program(&self) -> Option<PathBuf> {
        Some(PathBuf::from(env!("CARGO_BIN_EXE_lockgate-dir")))
    }

    fn create(&self, splits: u32) -> Result<Box<dyn SourceFixture>, String> {
        let dir = tempfile::tempdir_in(self.0.path())
            .map_err(|e| e.to_string())?
            .keep();
        for j in 0..splits {
            std::fs::write(dir.join(format!("f-{j}")), "").map_err(|e| e.to_string())?;
        }
        Ok(Box::new(Fixture { dir, written: 0 }))
    }
}

impl SourceFixture for Fixture {
    fn write(&mut self, split: u32, n: usize) -> Result<Vec<Vec<u8>>, String> {
        let lines: Vec<Vec<u8>> = (0..n)
            .map(|i| format!("{{\"file\":{split},\"line\":{}}}", self.written + i).into_bytes())
            .collect();
        self.written += n;
        let mut f = OpenOptions::new()
            .append(true)
            .open(self.dir.join(format!("f-{split}")))
            .map_err(|e| e.to_string())?;
        for l in &lines {
            f.write_all(l)
                .and_then(|_| f.write_all(b"\n"))
                .map_err(|e| e.to_string())?;
        }
        f.sync_all().map_err(|e| e.to_string())?;
        Ok(lines)
    }

    fn section(&self, bounded: bool) -> Result<(String, String), String> {
        Ok((
            "dir".into(),
            format!(
                "path = {:?}\nbounded = {bounded}\ndiscovery_ms = 100",
                self.dir.display().to_string()
            ),
        ))
    }

    fn spec(&self, bounded: bool) -> Result<SourceSpec, String> {
        let registry = lockgate::builtin::registry()
            .with_source::<lockgate_connector_dir_source::DirSection>("dir");
        let (name, section) = self.section(bounded)?;
        source_from_section(&registry, &name, &section, &self.dir)
    }
}

lockgate::source_conformance!(Context(tempfile::tempdir().unwrap()));
