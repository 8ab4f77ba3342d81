//! Replays every file of `fuzz/corpus/<target>/` through its target on stable: what the
//! fuzzer found worth keeping (and every crash it found, once fixed) stays tested.

use std::path::PathBuf;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus")
}

#[test]
fn every_corpus_file_passes_through_its_target() {
    // As the fuzz binaries and the `sluice` binary run: panics Sluice catches stay quiet.
    sluice_fuzz::init();
    for (name, target) in sluice_fuzz::TARGETS {
        let dir = corpus().join(name);
        let files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(!files.is_empty(), "{} holds no seed", dir.display());
        for file in &files {
            target(&std::fs::read(file).unwrap());
        }
        eprintln!("{name}: {} files", files.len());
    }
}

/// Cheap mutations of each seed (truncations, flipped bytes), so that a target whose
/// corpus was never fuzzed still meets broken input here. Only the seeds (`seed-*`): the
/// rest of a corpus is what the fuzzer already mutated.
#[test]
fn broken_seeds_pass_through_their_targets() {
    for (name, target) in sluice_fuzz::TARGETS {
        for file in std::fs::read_dir(corpus().join(name)).unwrap().flatten() {
            if !file.file_name().to_string_lossy().starts_with("seed-") {
                continue;
            }
            let seed = std::fs::read(file.path()).unwrap();
            for cut in (0..seed.len()).step_by(seed.len() / 64 + 1) {
                target(&seed[..cut]);
            }
            for at in (0..seed.len()).step_by(seed.len() / 64 + 1) {
                for flip in [0x01u8, 0x80, 0xff] {
                    let mut broken = seed.clone();
                    broken[at] ^= flip;
                    target(&broken);
                }
            }
        }
    }
}
