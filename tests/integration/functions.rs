//! The shipped preprocessing pipelines, run by real `sluice` processes: the image demo
//! (`sluice demo --images`) and `pipelines/text.sql`.

use std::path::Path;

use crate::common::Harness;

/// `sluice demo --images` generates JPEGs of mixed sizes, runs pipelines/images.sql
/// (random crops and flips, two epochs) and checks that every subscriber received every
/// row of every epoch exactly once against DataFusion's own per-epoch checksum. The
/// augmented pixels repeat for the same seed and change with it.
#[test]
fn the_image_demo_delivers_every_augmented_epoch_to_every_subscriber() {
    let mut h = Harness::new();
    let out = h.run(&[
        "demo",
        "--images",
        "--rows",
        "50",
        "--subscribers",
        "2",
        "--data",
        "data/images",
        "--plan",
        "images.sql",
    ]);
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("every subscriber received every row of every epoch exactly once"),
        "{}",
        out.stdout
    );
    let files = std::fs::read_dir(h.path("data/images"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("parquet".as_ref()))
        .count();
    assert_eq!(files, 2);

    let plan = std::fs::read_to_string(h.path("images.sql")).unwrap();
    assert!(plan.contains("SET sluice.shuffle_seed = 7;"));
    let checksum = |h: &mut Harness, seed: &str| {
        let path = h.plan(
            "seeded.sql",
            &plan.replace("SET sluice.shuffle_seed = 7;", seed),
        );
        h.source_checksum(&path)
    };
    let (rows, first) = checksum(&mut h, "SET sluice.shuffle_seed = 7;");
    assert_eq!(rows, 50);
    let (_, again) = checksum(&mut h, "SET sluice.shuffle_seed = 7;");
    assert_eq!(first, again, "the same seed gave other pixels");
    let (_, other) = checksum(&mut h, "SET sluice.shuffle_seed = 8;");
    assert_ne!(first, other, "another seed gave the same pixels");
}

/// pipelines/text.sql, as shipped, runs over the demo dataset with the shipped
/// tokenizer file and yields `[16]` token tensors.
#[test]
fn the_text_pipeline_tokenizes_the_demo_dataset() {
    let mut h = Harness::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::create_dir_all(h.path("pipelines")).unwrap();
    std::fs::copy(
        root.join("pipelines/tokenizer.json"),
        h.path("pipelines/tokenizer.json"),
    )
    .unwrap();
    let out = h.run(&[
        "demo",
        "--prepare-only",
        "--rows",
        "500",
        "--data",
        "data/demo",
        "--plan",
        "unused.sql",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let plan = root.join("pipelines/text.sql");
    let (rows, _) = h.source_checksum(&plan);
    assert!(rows > 400 && rows <= 500, "{rows}");
    let out = h.run(&["explain", plan.to_str().unwrap()]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stdout.contains("input_ids") && out.stdout.contains("FixedSizeList"),
        "{}",
        out.stdout
    );
}

/// The demo writes its dataset into a new directory or one it made, never over anything
/// else (it emptied any directory it was given), and the plan it writes reads `--data`.
#[test]
fn the_demo_never_replaces_a_directory_it_did_not_make() {
    let mut h = Harness::new();
    std::fs::create_dir_all(h.path("mine/sub")).unwrap();
    std::fs::write(h.path("mine/thesis.txt"), b"keep").unwrap();
    let prepare = |h: &mut Harness, rows: &str, data: &str, plan: &str| {
        h.run(&[
            "demo",
            "--prepare-only",
            "--rows",
            rows,
            "--data",
            data,
            "--plan",
            plan,
        ])
    };
    let refused = prepare(&mut h, "100", "mine", "a.sql");
    assert!(!refused.status.success());
    assert!(
        refused.stderr.contains("holds files the demo did not make"),
        "{}",
        refused.stderr
    );
    assert_eq!(std::fs::read(h.path("mine/thesis.txt")).unwrap(), b"keep");
    assert!(h.path("mine/sub").is_dir() && !h.path("a.sql").exists());
    // Its own directory, made again for another size; the plan reads it.
    for rows in ["100", "200"] {
        let out = prepare(&mut h, rows, "elsewhere/d", "b.sql");
        assert!(out.status.success(), "{}", out.stderr);
    }
    assert!(h.path("elsewhere/d/.complete-200").exists());
    let plan = std::fs::read_to_string(h.path("b.sql")).unwrap();
    assert!(plan.contains("LOCATION 'elsewhere/d/'"), "{plan}");
    let explained = h.run(&["explain", "b.sql"]);
    assert!(explained.status.success(), "{}", explained.stderr);
    let huge = prepare(&mut h, "1000000000000", "big", "c.sql");
    assert!(
        huge.stderr.contains("--rows must be 1 to"),
        "{}",
        huge.stderr
    );
    // A dataset another tool wrote, named as the demo names its parts (pyarrow's
    // write_dataset writes part-0.parquet): not the demo's.
    std::fs::create_dir(h.path("theirs")).unwrap();
    std::fs::write(h.path("theirs/part-0.parquet"), b"theirs").unwrap();
    let refused = prepare(&mut h, "100", "theirs", "d.sql");
    assert!(
        refused.stderr.contains("holds files the demo did not make"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        std::fs::read(h.path("theirs/part-0.parquet")).unwrap(),
        b"theirs"
    );
    // A plan there already that reads another directory than --data.
    let other = prepare(&mut h, "100", "elsewhere/e", "b.sql");
    assert!(
        other.stderr.contains("does not read elsewhere/e"),
        "{}",
        other.stderr
    );
}
