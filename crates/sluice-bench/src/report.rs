//! The Markdown report, built section by section: its head, the goals, the summary and
//! helpers that every comparison's section uses (each section is rendered next to its
//! measurements, in its comparison's module).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use crate::stats::{self, Machine, Summary};
use crate::{Args, Scale, data};

/// The Markdown report, built section by section.
pub(crate) struct Report {
    head: String,
    pub(crate) dataset: String,
    pub(crate) body: String,
    pub(crate) notes: Vec<String>,
    pub(crate) summary: Vec<String>,
    /// Issue 18's table: what, now, goal, met (`None`: not measured).
    pub(crate) goals: Vec<(String, String, &'static str, Option<bool>)>,
}

impl Report {
    /// The report's head: the command, date, commit, machine, build and the run's options.
    pub(crate) fn new(args: &Args, scale: &Scale, repo: &Path) -> Result<Self> {
        let m = Machine::describe();
        let (commit, dirty) = commit(args, repo);
        let command = command_line();
        let mut head = String::new();
        writeln!(head, "# Benchmark results (generated)\n")?;
        writeln!(
            head,
            "Written by `sluice-bench`; do not edit by hand: run the command again. What each \
             comparison measures and how to read it: [benchmarks.md](benchmarks.md).\n"
        )?;
        writeln!(
            head,
            "* Command: `{command}`{}",
            if args.quick {
                " (quick mode: less data, fewer samples)"
            } else {
                ""
            }
        )?;
        writeln!(head, "* Date: {}", stats::utc_now()?)?;
        writeln!(
            head,
            "* Commit: `{commit}`{}",
            if dirty {
                " (with uncommitted changes)"
            } else {
                ""
            }
        )?;
        writeln!(
            head,
            "* Machine: {}, {} logical CPUs, {} RAM, {}; /dev/shm {}",
            m.cpu, m.cores, m.memory, m.os, m.shm
        )?;
        writeln!(
            head,
            "* Build: {}; {} repetitions of every measurement, reported as median (min–max)",
            if cfg!(debug_assertions) {
                "**debug** (figures not representative)"
            } else {
                "release"
            },
            scale.reps
        )?;
        option_lines(&mut head, args)?;
        Ok(Self {
            head,
            dataset: String::new(),
            body: String::new(),
            notes: Vec::new(),
            summary: Vec::new(),
            goals: Vec::new(),
        })
    }

    pub(crate) fn image(
        &mut self,
        ok: bool,
        img: &Path,
        name: &str,
        alt: &str,
        draw: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<()> {
        if !ok {
            return Ok(());
        }
        draw(&img.join(name))?;
        writeln!(self.body, "\n![{alt}](img/{name})")?;
        Ok(())
    }

    pub(crate) fn goal(
        &mut self,
        what: String,
        now: String,
        goal: &'static str,
        met: Option<bool>,
    ) {
        self.goals.push((what, now, goal, met));
    }

    pub(crate) fn skipped(&mut self, section: &str, why: &str) {
        eprintln!("  skipped: {why}");
        let _ = writeln!(self.body, "\n## {section}\n\nSkipped: {why}.");
        self.summary.push(format!("{section}: skipped ({why})"));
    }

    pub(crate) fn finish(mut self, elapsed: f64) -> String {
        let mut out = self.head;
        let _ = writeln!(out, "* Dataset: {}", self.dataset);
        let _ = writeln!(out, "* Wall time of the whole command: {elapsed:.0} s\n");
        let _ = writeln!(out, "## Goals\n");
        let _ = writeln!(out, "| comparison (same run) | now | goal | |");
        let _ = writeln!(out, "|---|---|---|---|");
        for (what, now, goal, met) in &self.goals {
            let met = match met {
                Some(ok) => verdict(*ok),
                None => "not measured",
            };
            let _ = writeln!(out, "| {what} | {now} | {goal} | {met} |");
        }
        let _ = writeln!(out, "\n## Summary\n");
        for s in &self.summary {
            let _ = writeln!(out, "* {s}");
        }
        for n in self.notes.drain(..) {
            let _ = writeln!(out, "\n{n}");
        }
        out.push_str(&self.body);
        out
    }
}

/// The commit the binary was built from (`--commit`, else the checkout's `HEAD`) and
/// whether the checkout has uncommitted changes.
fn commit(args: &Args, repo: &Path) -> (String, bool) {
    match &args.commit {
        Some(commit) => (commit.clone(), false),
        None => {
            let commit = stats::command_output(
                "git",
                &[
                    "-C",
                    &repo.to_string_lossy(),
                    "rev-parse",
                    "--short",
                    "HEAD",
                ],
            )
            .unwrap_or_else(|| "unknown".into());
            // The report and plots this command writes do not make the tree dirty.
            let out = args.out.to_string_lossy();
            let dirty = stats::command_output(
                "git",
                &[
                    "-C",
                    &repo.to_string_lossy(),
                    "status",
                    "--porcelain",
                    "--",
                    ".",
                    &format!(":(exclude){out}/benchmarks-generated.md"),
                    &format!(":(exclude){out}/img"),
                ],
            )
            .is_some_and(|s| !s.is_empty());
            (commit, dirty)
        }
    }
}

/// The command this run was started with, as the report gives it.
fn command_line() -> String {
    let mut command = String::from("cargo run --release -p sluice-bench --");
    for a in std::env::args().skip(1) {
        command.push(' ');
        command.push_str(&a);
    }
    command
}

/// The head's lines on the run's options: the topics' window and messages, and the
/// options given only where they differ from the defaults.
fn option_lines(head: &mut String, args: &Args) -> Result<()> {
    writeln!(
        head,
        "* Topics of comparisons 1 to 3: `sluice.window = {}`{}",
        data::window_option(),
        match args.window.0 {
            None => " (the default; comparisons 1 and 2b say what it came to)",
            Some(_) => " (`--window`; the default is 'auto')",
        }
    )?;
    writeln!(
        head,
        "* Messages of comparisons 1 to 3: `sluice.message_batches = {}`{}",
        data::message_batches_option(),
        match args.message_batches.0 {
            None =>
                " (the default: consecutive batches ready at once go as one message of about 1 MiB)",
            Some(_) => " (`--message-batches`; the default is 'auto')",
        }
    )?;
    if let Some(rows) = args.datafusion_batch_size {
        writeln!(
            head,
            "* Plans of comparisons 1, 2 and 2b (Sluice's and the independent pipelines'): \
             `datafusion.execution.batch_size = {rows}` (`--datafusion-batch-size`; the \
             default is DataFusion's, 8 192 rows)"
        )?;
    }
    if let Some(rows) = args.row_group_rows {
        writeln!(
            head,
            "* The dataset's Parquet row groups: {rows} rows (`--row-group-rows`; the default \
             is {})",
            data::ROW_GROUP_ROWS
        )?;
    }
    if let Some(threads) = args.flight_threads {
        writeln!(
            head,
            "* Comparison 3b's `sluice-flight` server: {threads} worker threads \
             (`--flight-threads`; the default is one per core)"
        )?;
    }
    writeln!(
        head,
        "* Everything runs in one process: producers, servers and consumers are threads \
         (each independent pipeline and each Flight client with a tokio runtime of its own)."
    )?;
    Ok(())
}

pub(crate) fn size_label(kib: usize) -> String {
    if kib >= 1024 {
        format!("{} MiB", kib >> 10)
    } else {
        format!("{kib} KiB")
    }
}

pub(crate) fn median(values: &[f64]) -> f64 {
    Summary::of(values).median
}

pub(crate) fn ratio_summary(pairs: impl IntoIterator<Item = (f64, f64)>) -> Summary {
    Summary::of(&pairs.into_iter().map(|(a, b)| a / b).collect::<Vec<_>>())
}

pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**not met**" }
}
