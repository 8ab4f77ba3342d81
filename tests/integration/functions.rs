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
