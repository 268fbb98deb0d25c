//! The journal sink passes lockgate's connector conformance suite, and the suite fails
//! it when it commits at the barrier instead of when the checkpoint completes.

use lockgate::connector::SinkSpec;
use lockgate::testkit::conformance::sink::{run_case, SinkFixture, SinkTestContext};
use lockgate::testkit::conformance::visibility::CommitAtBarrier;
use serde_json::Value;
use std::path::PathBuf;

/// Each fixture is a directory of its own, read as a reader of the output reads it
/// ([`lockgate_connector_journal_sink::read_committed`]).
struct Context(tempfile::TempDir);

struct Fixture(PathBuf);

impl SinkTestContext for Context {
    /// This crate's `lockgate-journal`: the command line with `[sink.journal]`.
    fn program(&self) -> Option<PathBuf> {
        Some(PathBuf::from(env!("CARGO_BIN_EXE_lockgate-journal")))
    }

    fn create(&self) -> Result<Box<dyn SinkFixture>, String> {
        let dir = tempfile::tempdir_in(self.0.path())
            .map_err(|e| e.to_string())?
            .keep();
        Ok(Box::new(Fixture(dir.join("out"))))
    }
}

impl SinkFixture for Fixture {
    fn spec(&self) -> Result<SinkSpec, String> {
        Ok(lockgate_connector_journal_sink::spec(self.0.clone()))
    }

    fn read(&self) -> Result<Vec<Value>, String> {
        if !self.0.exists() {
            return Ok(Vec::new());
        }
        let lines =
            lockgate_connector_journal_sink::read_committed(&self.0).map_err(|e| e.to_string())?;
        lines
            .iter()
            .map(|l| {
                serde_json::from_slice(l)
                    .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(l)))
            })
            .collect()
    }

    /// Nothing may be left staged or half written after a finished run.
    fn settled(&self) -> Result<(), String> {
        let rd = std::fs::read_dir(&self.0).map_err(|e| e.to_string())?;
        let left: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("left behind: {left:?}"))
        }
    }

    fn section(&self) -> Result<(String, String), String> {
        Ok((
            "journal".into(),
            format!("dir = {:?}", self.0.display().to_string()),
        ))
    }
}

lockgate::sink_conformance!(Context(tempfile::tempdir().unwrap()));

/// The suite catches this sink when its commits run at the barrier.
#[test]
fn the_suite_fails_the_journal_sink_when_it_commits_at_the_barrier() {
    let tmp = tempfile::tempdir().unwrap();
    let cx = CommitAtBarrier(Context(tempfile::tempdir().unwrap()));
    let e = run_case("visibility_at_checkpoints", &cx, tmp.path()).unwrap_err();
    assert!(e.contains("visible before the checkpoint completed"), "{e}");
}
