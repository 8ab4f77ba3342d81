//! Where a topic's shared memory and service files live, and who may touch them.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use iceoryx2::config::Config;
use iceoryx2::identifiers::UniqueNodeId;
use iceoryx2::node::NodeView;
use iceoryx2::prelude::Path as IoxPath;
use iceoryx2::prelude::{CallbackProgression, Node};
use iceoryx2::prelude::{
    FileName, NodeBuilder, NodeName, NodeState, SemanticString, SignalHandlingMode,
};
use iceoryx2_cal::monitoring::{Monitoring, MonitoringBuilder, MonitoringMonitor, State};
use iceoryx2_cal::named_concept::{
    NamedConceptBuilder, NamedConceptConfiguration, NamedConceptMgmt,
};
use sluice_core::{Result, SluiceError};

use crate::{Ipc, transport};

/// How often a polling loop reclaims (see [`Namespace::reclaim_dead_now_and_then`]).
pub(crate) const RECLAIM_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The name of a producer's node (see [`Namespace::reclaim_dead`]).
pub(crate) const PRODUCER: &str = "producer";

/// Directory of POSIX shared memory on Linux.
pub const SHM_DIR: &str = "/dev/shm";

/// The longest Unix socket path iceoryx2 binds (`sockaddr_un::sun_path`).
const SOCKET_PATH_MAX: usize = 108;
/// Digits of the largest listener id (`u128::MAX`).
const LISTENER_ID_DIGITS: usize = 39;

/// An isolated set of topics: its own shared-memory prefix and service directory.
///
/// The default namespace is per user (`u<uid>`), so users on one machine never see each
/// other's topics. `SLUICE_NAMESPACE` selects another one (tests use one each).
/// Everything is created readable and writable by the owner only: the service
/// directory is `0700`, and iceoryx2's node-counter segment, which iceoryx2 creates
/// world-writable, is narrowed to `0600`.
#[derive(Debug, Clone)]
pub struct Namespace {
    name: String,
    config: Config,
    /// The service directory (see [`Namespace::root`]), decided once: iceoryx2's
    /// configuration and Sluice's own sweeps must agree on it.
    root: PathBuf,
}

impl Namespace {
    /// The namespace from `SLUICE_NAMESPACE`, or the current user's (`u<uid>`, or a
    /// private name where another user took that one first: `default_name`).
    pub fn from_env() -> Result<Self> {
        match std::env::var("SLUICE_NAMESPACE") {
            Ok(name) if !name.is_empty() => Self::new(&name),
            _ => {
                // SAFETY: getuid has no preconditions and cannot fail.
                let uid = unsafe { libc::getuid() };
                let name = default_name(&Self::base_dir(), Path::new(SHM_DIR), uid, user_dir)?;
                Self::new(&name)
            }
        }
    }

    /// A named namespace: characters from `[A-Za-z0-9_-]`, at least one, and few enough
    /// that its event sockets' paths fit a Unix socket address ([`Namespace::max_name_len`]:
    /// 16 with the service directory in `/dev/shm`).
    pub fn new(name: &str) -> Result<Self> {
        // Every use of Sluice starts here: the process's iceoryx2 identity is settled and
        // noted before anything can read a node monitor (see `process::forked_identity`).
        crate::process::note_identity();
        let base = Self::base_dir();
        let Some(max) = Self::max_name_len_in(&base) else {
            return Err(SluiceError::Config(format!(
                "the service directory's path ({}/sluice-<namespace>) is too long for Unix \
                 sockets of at most {SOCKET_PATH_MAX} bytes: set TMPDIR to a shorter directory",
                base.display()
            )));
        };
        let valid = !name.is_empty()
            && name.len() <= max
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(SluiceError::Config(format!(
                "invalid SLUICE_NAMESPACE '{name}': use 1 to {max} characters from A-Z, a-z, 0-9, '_', '-' \
                 (event sockets live at {}/sluice-<namespace>/<shared-memory prefix><port id>.event, \
                 and a Unix socket path has at most {SOCKET_PATH_MAX} bytes)",
                base.display()
            )));
        }
        let mut config = Config::default();
        let prefix = format!("iox2_sluice_{name}_");
        config.global.prefix = FileName::new(prefix.as_bytes())
            .map_err(|e| SluiceError::Config(format!("bad shared-memory prefix {prefix}: {e}")))?;
        let root = base.join(format!("sluice-{name}"));
        let mut root_str = root.display().to_string();
        root_str.push('/');
        let root_path = IoxPath::new(root_str.as_bytes())
            .map_err(|e| SluiceError::Config(format!("bad service directory {root_str}: {e}")))?;
        config.global.set_root_path(&root_path);
        // iceoryx2 would remove every dead node's resources whenever a node is created or
        // dropped and whenever a service is opened, that is whenever any process of the
        // namespace starts, ends or attaches. A dead producer's data segment still holds
        // the messages queued for its subscribers, and a subscriber maps a publisher's
        // segment only when it first receives from it: removed before that, they are
        // lost. Sluice reclaims by itself, when nothing is lost (`reclaim_dead`).
        config.global.node.cleanup_dead_nodes_on_creation = false;
        config.global.node.cleanup_dead_nodes_on_destruction = false;
        config.global.service.cleanup_dead_nodes_on_open = false;
        Ok(Self {
            name: name.to_string(),
            config,
            root,
        })
    }

    /// The longest namespace name whose event sockets' paths fit a Unix socket address.
    ///
    /// iceoryx2 names a listener's socket `<service directory>/<prefix><listener id>.event`,
    /// the prefix being `iox2_sluice_<name>_` and the id a decimal `u128` of up to 39
    /// digits, which grows with the ports a process has created: a name that fits only
    /// short ids would fail later, in a long-running or reconnecting process. So the
    /// worst case has to fit.
    pub fn max_name_len() -> usize {
        Self::max_name_len_in(&Self::base_dir()).unwrap_or(0)
    }

    /// [`Namespace::max_name_len`] for service directories in `base`; `None` when not even
    /// a one-character name fits.
    fn max_name_len_in(base: &Path) -> Option<usize> {
        // "<base>/sluice-<name>" + "/" + "iox2_sluice_<name>_" + id + ".event": the name
        // counts twice.
        let fixed = base.as_os_str().len()
            + "/sluice-".len()
            + "/".len()
            + "iox2_sluice__".len()
            + LISTENER_ID_DIGITS
            + ".event".len();
        let max = SOCKET_PATH_MAX.checked_sub(fixed)? / 2;
        (max >= 1).then_some(max)
    }

    /// Where service directories live: `/dev/shm`, beside the topics' segments:
    /// * it is a RAM file system, where creating and removing the node, service and
    ///   socket files of every process that attaches costs no disk block lookups (on an
    ///   ext4 `/tmp` that busy with files created and removed, inode allocation alone was
    ///   a sixth of a short-lived subscriber's CPU; docs/history/benchmarks-2026-11.md);
    /// * every process that can share a topic shares `/dev/shm` (the segments are there),
    ///   where `/tmp` or `TMPDIR` may differ between them (containers sharing the host's
    ///   IPC namespace have a `/tmp` of their own).
    ///
    /// Without a `/dev/shm` directory, the temporary directory.
    fn base_dir() -> PathBuf {
        let shm = Path::new(SHM_DIR);
        if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        }
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The iceoryx2 configuration of this namespace.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The directory that holds the namespace's service and node files.
    pub fn root(&self) -> PathBuf {
        self.root.clone()
    }

    /// The directory of the namespace's durable state (producer checkpoints, status
    /// reports): in `$XDG_RUNTIME_DIR` where it is set (a directory of this user's
    /// alone), else in the temporary directory; apart from the service directory, so
    /// that reclaiming a crashed process's resources never touches it. Created
    /// owner-only on first use ([`Namespace::prepare_state_dir`]).
    pub fn state_dir(&self) -> PathBuf {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|dir| dir.is_absolute() && dir.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        base.join(format!("sluice-{}.state", self.name))
    }

    /// Creates the state directory owner-only, or checks that an existing one is a
    /// directory of this user's that nobody else can enter (narrowing its mode if it
    /// must): in a shared `/tmp` another user could otherwise create it first, then read
    /// or forge checkpoints, or plant links where state is written.
    pub fn prepare_state_dir(&self) -> Result<PathBuf> {
        let dir = self.state_dir();
        private_dir(
            &dir,
            "set TMPDIR or XDG_RUNTIME_DIR to a directory of your own",
        )?;
        Ok(dir)
    }

    /// The prefix of the namespace's files in `/dev/shm`.
    pub fn shm_prefix(&self) -> String {
        format!("iox2_sluice_{}_", self.name)
    }

    /// What the monitor of `node` says of its process, read from that one monitor.
    ///
    /// iceoryx2's `Node::state_of` lists every node of the namespace and, for each one
    /// until it finds `node`, reads and parses the node's details (its whole
    /// configuration) before it asks the node's monitor: 0.26 ms for another process's
    /// node among 5, against 28–30 µs for this (docs/history/benchmarks-2026-11.md, "Node states from
    /// their monitors").
    /// Subscribers ask on every liveness check, and when they attach and let go. This
    /// asks the monitor alone, at the path iceoryx2 gives it; a test holds the two to
    /// the same answers for live, dead and removed nodes.
    pub(crate) fn node_liveness(&self, node: &UniqueNodeId) -> Liveness {
        match FileName::new(node.value().to_string().as_bytes()) {
            Ok(name) => monitor_state(&self.monitor_config(), &name),
            Err(_) => Liveness::Unknown,
        }
    }

    /// What the monitor of every node of this namespace says, as
    /// [`Namespace::node_liveness`] reads one; `None` when the monitors cannot be listed.
    ///
    /// The monitors are found by one listing of the node directory, taking the regular
    /// files named `<prefix><node><monitor suffix>` as iceoryx2's `list_cfg` of its
    /// file-lock monitoring does, but with the file types the listing gives: `list_cfg`
    /// reads every entry's metadata and formats its path, half of a reclaim's time with
    /// 20 nodes (docs/history/benchmarks-2026-11.md, "Reclaiming among many nodes").
    pub(crate) fn monitor_states(&self) -> Option<Vec<Liveness>> {
        let config = self.monitor_config();
        let global = &self.config.global;
        let prefix = global.prefix.to_string();
        let suffix = global.node.monitor_suffix.to_string();
        let entries = match std::fs::read_dir(global.node_dir().to_string()) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(Vec::new()),
            Err(_) => return None,
        };
        let mut states = Vec::new();
        for entry in entries {
            let entry = entry.ok()?;
            let file = entry.file_name();
            let Some(node) = file
                .to_str()
                .and_then(|f| f.strip_prefix(&prefix))
                .and_then(|f| f.strip_suffix(&suffix))
            else {
                continue;
            };
            // `list_cfg` skips a name that is not a valid file name, and takes what
            // `stat` says is a regular file (a link to one too), skipping an entry gone
            // since the listing.
            let Ok(name) = FileName::new(node.as_bytes()) else {
                continue;
            };
            let is_file = match entry.file_type() {
                Ok(t) if t.is_symlink() => entry.path().metadata().is_ok_and(|m| m.is_file()),
                Ok(t) => t.is_file(),
                Err(_) => false,
            };
            if is_file {
                states.push(monitor_state(&config, &name));
            }
        }
        Some(states)
    }

    /// Where this namespace's node monitors are: what iceoryx2's (private)
    /// `node_monitoring_config` derives from the configuration, the namespace's prefix,
    /// the node directory and the monitor suffix.
    pub(crate) fn monitor_config(&self) -> <NodeMonitor as NamedConceptMgmt>::Configuration {
        let global = &self.config.global;
        <NodeMonitor as NamedConceptMgmt>::Configuration::default()
            .prefix(&global.prefix)
            .suffix(&global.node.monitor_suffix)
            .path_hint(&global.node_dir())
    }

    /// Creates an iceoryx2 node in this namespace, owner-only.
    pub(crate) fn node(&self, role: &str) -> Result<Node<Ipc>> {
        self.prepare_root()?;
        // iceoryx2 sizes the namespace's node counter when it creates it and then writes
        // into it: on a full /dev/shm that write is a SIGBUS, so a full one is refused
        // before the counter exists (later nodes add a few small files, and say a
        // failure as an error).
        if !self.has_node_counter()
            && let Some(free) = shm_full()
        {
            return Err(full_shm(role, free));
        }
        // The role names the node, so that a reclaimer knows a dead producer's node.
        let name = NodeName::new(role)
            .map_err(|e| SluiceError::Internal(format!("bad node name '{role}': {e}")))?;
        let node = NodeBuilder::new()
            .name(&name)
            .config(&self.config)
            // Sluice handles signals itself (Ctrl-C in Python, clean producer shutdown).
            .signal_handling_mode(SignalHandlingMode::Disabled)
            .create::<Ipc>()
            .map_err(|e| match shm_full() {
                Some(free) => full_shm(role, free),
                None => transport(format!("cannot create {role} node"))(e),
            })?;
        self.narrow_global_segment();
        Ok(node)
    }

    /// Creates the service directory, owner-only, or checks that it is one of ours.
    pub(crate) fn prepare_root(&self) -> Result<()> {
        private_dir(&self.root(), "set SLUICE_NAMESPACE")
    }

    /// iceoryx2 makes its node counter world-writable so that any user's nodes can share
    /// it; a namespace belongs to one user, so take write access away from the others.
    /// Whether the namespace's node counter (iceoryx2's `…global_mgmt` segment) exists.
    fn has_node_counter(&self) -> bool {
        self.files_in(Path::new(SHM_DIR))
            .iter()
            .any(|p| p.to_string_lossy().ends_with("global_mgmt"))
    }

    fn narrow_global_segment(&self) {
        for path in self.files_in(Path::new(SHM_DIR)) {
            let is_global = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("global_mgmt"));
            if is_global {
                narrow_own_file(&path);
            }
        }
    }

    fn files_in(&self, dir: &Path) -> Vec<PathBuf> {
        let prefix = self.shm_prefix();
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| is_file_of(&e.file_name().to_string_lossy(), &prefix))
            .map(|e| e.path())
            .collect()
    }

    /// Removes the resources of every dead process of this namespace (crashed producers
    /// and subscribers, the interest registrations of subscribers killed while they
    /// waited, and the departures of those killed while they kept batches). Returns how many dead nodes were cleaned.
    ///
    /// A dead producer is left alone while any service it belongs to has a node that is
    /// not dead: its subscribers, whose queues point into its data segment (a subscriber
    /// that has not received from it yet has not mapped it: iceoryx2 maps a publisher's
    /// segment on the first receive from it, so removing it would lose those messages),
    /// and processes that still hold one of its batches. It is reclaimed once they have
    /// let go.
    pub fn reclaim_dead(&self) -> usize {
        // Only a service directory of this user's: another user's (a namespace of the
        // same name made first) is not this process's to clean, and nothing is reclaimed
        // where there is none.
        let ours = std::fs::symlink_metadata(self.root()).is_ok_and(|meta| {
            // SAFETY: getuid has no preconditions and cannot fail.
            meta.is_dir() && meta.uid() == unsafe { libc::getuid() }
        });
        if !ours {
            return 0;
        }
        let mut cleaned = 0;
        let mut orphans = Vec::new();
        // Listing the nodes reads every node's details: about 0.2 ms a node, on the
        // publishing thread when it reclaims (at an epoch's end, on a full queue).
        // Only where a monitor says a node is dead, or they cannot be listed, so that a
        // reclaim with nothing dead to reclaim reads no node's details.
        let may_have_dead = self
            .monitor_states()
            .is_none_or(|states| states.contains(&Liveness::Gone));
        if may_have_dead {
            let _ = Node::<Ipc>::list(&self.config, |state| {
                if let NodeState::Dead(view) = state {
                    match view.details() {
                        None => orphans.push(view.id().to_string()),
                        Some(d) if d.name() == PRODUCER && self.still_read(view.id()) => {
                            tracing::debug!(node = %view.id(), "a dead producer's subscribers still read its topic");
                        }
                        Some(_) => {
                            if view.try_remove_stale_resources().is_ok() {
                                cleaned += 1;
                            }
                        }
                    }
                }
                CallbackProgression::Continue
            });
        }
        for id in orphans {
            if self.remove_orphan_node(&id) {
                cleaned += 1;
            }
        }
        cleaned += self.sweep_unmonitored_nodes();
        self.sweep_orphan_listeners();
        crate::interest::sweep(self);
        crate::departure::sweep(self);
        crate::pacing::sweep(self);
        crate::ending::sweep(self);
        crate::claim::sweep(self);
        // A process killed between creating the node counter and narrowing it.
        self.narrow_global_segment();
        cleaned
    }

    /// [`Namespace::reclaim_dead`], unless this process did so in this namespace less
    /// than [`RECLAIM_EVERY`] ago: for loops that poll (a reclaim reads the namespace's
    /// directories, about a millisecond). Kept per namespace, so that loops in other
    /// namespaces of the process (tests run many) never take this one's turn.
    pub(crate) fn reclaim_dead_now_and_then(&self) {
        static LAST: std::sync::Mutex<std::collections::BTreeMap<String, std::time::Instant>> =
            std::sync::Mutex::new(std::collections::BTreeMap::new());
        let due = {
            let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
            let due = last
                .get(&self.name)
                .is_none_or(|t| t.elapsed() >= RECLAIM_EVERY);
            if due {
                last.insert(self.name.clone(), std::time::Instant::now());
            }
            due
        };
        if due {
            self.reclaim_dead();
        }
    }

    /// Whether a service that the dead node `dead` belongs to has a node that is not dead
    /// (or cannot be told to be): for a dead producer, a subscriber that may still have
    /// to take what it queued. When the services cannot be listed, they may.
    fn still_read(&self, dead: &UniqueNodeId) -> bool {
        let mut shared = false;
        let listed = <Ipc as iceoryx2::prelude::Service>::list(&self.config, |service| {
            let nodes = service.dynamic_details.map(|d| d.nodes).unwrap_or_default();
            if nodes.iter().any(|n| n.node_id() == dead)
                && nodes.iter().any(|n| !matches!(n, NodeState::Dead(_)))
            {
                shared = true;
                return CallbackProgression::Stop;
            }
            CallbackProgression::Continue
        });
        shared || listed.is_err()
    }

    /// Removes node directories that no monitor accounts for and that hold nothing but
    /// the node's details, once they are older than iceoryx2's creation timeout.
    ///
    /// A process killed while creating its node (after writing its details, before its
    /// monitor) leaves such a directory, and iceoryx2 finds nodes through their monitors,
    /// so it would never clean it. A live node always has its monitor, except during the
    /// microseconds of its creation; the age check covers those.
    fn sweep_unmonitored_nodes(&self) -> usize {
        let nodes = self
            .root()
            .join(self.config.global.node.directory.to_string());
        let prefix = self.shm_prefix();
        let details = self.config.global.node.static_config_suffix.to_string();
        let timeout = self.config.global.creation_timeout;
        // The nodes that have a monitor file (`<prefix><node>.<suffix>`), all found by one
        // listing: looking for each node's monitor in a listing of its own made a reclaim
        // quadratic in the nodes (docs/history/benchmarks-2026-11.md, "Reclaiming among many nodes").
        let monitor_of = |e: &std::fs::DirEntry| -> Option<String> {
            let file = e.file_name().to_string_lossy().to_string();
            let rest = file.strip_prefix(&prefix)?;
            Some(rest.split_once('.')?.0.to_string())
        };
        let list = || std::fs::read_dir(&nodes).into_iter().flatten().flatten();
        let listing: Vec<std::fs::DirEntry> = list().collect();
        let monitored: std::collections::HashSet<String> =
            listing.iter().filter_map(monitor_of).collect();
        let mut removed = 0;
        for entry in &listing {
            let id = entry.file_name().to_string_lossy().to_string();
            if monitored.contains(&id)
                || !id.bytes().all(|b| b.is_ascii_digit())
                || !entry.file_type().is_ok_and(|t| t.is_dir())
            {
                continue;
            }
            // A listing taken while another process edits the directory can miss an
            // entry: a node counts as unmonitored only if a second listing agrees.
            if list().any(|e| monitor_of(&e).is_some_and(|node| node == id)) {
                continue;
            }
            let only_details = std::fs::read_dir(entry.path())
                .into_iter()
                .flatten()
                .flatten()
                .all(|e| e.file_name().to_string_lossy().ends_with(&details));
            let old = entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > timeout);
            if only_details && old && std::fs::remove_dir_all(entry.path()).is_ok() {
                tracing::debug!(node = %id, "removed a node directory without a monitor");
                removed += 1;
            }
        }
        removed
    }

    /// Removes event-listener files that no port tag accounts for.
    ///
    /// iceoryx2 creates a listener's port tag before its files and removes it after them,
    /// so a listener file whose id is in no node's port tags belongs to no port: a process
    /// killed while it reclaimed a dead node was seen to leave such files. Candidates are
    /// listed before the tags, so a listener created meanwhile is never taken for one.
    fn sweep_orphan_listeners(&self) -> usize {
        let prefix = self.shm_prefix();
        // `<prefix>[<service hash>_]<listener id>.<suffix>`: the id is the last number.
        let listener_id = |path: &Path, suffix: &str| -> Option<String> {
            let name = path.file_name()?.to_str()?;
            let stem = name.strip_prefix(&prefix)?.strip_suffix(suffix)?;
            let id = stem.rsplit('_').next()?;
            (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_string())
        };
        let mut candidates: Vec<(PathBuf, String)> = Vec::new();
        for path in self.files_in(Path::new(SHM_DIR)) {
            if let Some(id) = listener_id(&path, ".event_mgmt") {
                candidates.push((path, id));
            }
        }
        for path in self.files_in(&self.root()) {
            if let Some(id) = listener_id(&path, ".event") {
                candidates.push((path, id));
            }
        }
        if candidates.is_empty() {
            return 0;
        }
        let nodes = self
            .root()
            .join(self.config.global.node.directory.to_string());
        let mut tagged = std::collections::HashSet::new();
        for dir in std::fs::read_dir(&nodes).into_iter().flatten().flatten() {
            for tag in std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Some(id) = listener_id(&tag.path(), ".port_tag") {
                    tagged.insert(id);
                }
            }
        }
        let mut removed = 0;
        for (path, id) in candidates {
            if !tagged.contains(&id) && std::fs::remove_file(&path).is_ok() {
                tracing::debug!(file = %path.display(), "removed an orphaned listener file");
                removed += 1;
            }
        }
        removed
    }

    /// Removes what is left of a dead node that lost its details file.
    ///
    /// iceoryx2 cleans a dead node with the configuration recorded in that file; without
    /// it, it falls back to its global default configuration and looks in the wrong
    /// directory, so the node's files here would stay for good. The file goes only when
    /// a node is being removed (by its own process at exit, or by a reclaimer), which is
    /// the last step, after its services and ports were dealt with: a process killed in
    /// that step leaves only the node's own files, which are safe to delete once its
    /// monitor says it is dead. `hex_id` is the node id as iceoryx2 displays it.
    fn remove_orphan_node(&self, hex_id: &str) -> bool {
        let Ok(id) = u128::from_str_radix(hex_id, 16) else {
            return false;
        };
        let nodes = self
            .root()
            .join(self.config.global.node.directory.to_string());
        let _ = std::fs::remove_dir_all(nodes.join(id.to_string()));
        // The monitor files last: while they exist the node is still listed.
        let stem = format!("{}{id}.", self.shm_prefix());
        let mut monitor: Vec<PathBuf> = std::fs::read_dir(&nodes)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&stem))
            .map(|e| e.path())
            .collect();
        // The owner lock is what marks the node as existing: remove it after the rest.
        monitor.sort_by_key(|p| p.to_string_lossy().ends_with("_owner_lock"));
        for path in &monitor {
            let _ = std::fs::remove_file(path);
        }
        tracing::debug!(node = %id, files = monitor.len(), "removed the files of a dead node without details");
        !monitor.is_empty()
    }

    /// How long the static configuration of `name` has been left half-created: it still
    /// has iceoryx2's initial permissions (owner read-write; creating a service ends by
    /// making it read-only). `None` when there is no such file or it was finalized.
    pub(crate) fn half_created_for(
        &self,
        name: &iceoryx2::prelude::ServiceName,
        pattern: iceoryx2::prelude::MessagingPattern,
    ) -> Option<(PathBuf, std::time::Duration)> {
        let hash = iceoryx2::service::service_hash::ServiceHash::new::<
            <Ipc as iceoryx2::service::Service>::ServiceNameHasher,
        >(name, pattern);
        let service = &self.config.global.service;
        let file = self
            .root()
            .join(service.directory.to_string())
            .join(format!(
                "{}{}{}",
                self.config.global.prefix,
                hash.as_str(),
                service.static_config_storage_suffix
            ));
        let meta = std::fs::symlink_metadata(&file).ok()?;
        if !meta.is_file() || meta.mode() & 0o777 != 0o600 {
            return None;
        }
        let age = meta
            .modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .unwrap_or_default();
        Some((file, age))
    }

    /// Files of this namespace that are still present: shared-memory segments (except
    /// iceoryx2's persistent node counter) and service or node files (except the record of
    /// each topic's last generation, kept on purpose: see `takeover::remember_generation`).
    pub fn leftovers(&self) -> Vec<PathBuf> {
        let kept = self.root().join("generations");
        let mut out: Vec<PathBuf> = self
            .files_in(Path::new(SHM_DIR))
            .into_iter()
            .filter(|p| !p.to_string_lossy().ends_with("global_mgmt"))
            .collect();
        let mut stack = vec![self.root()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path == kept {
                    continue;
                } else if path.is_dir() {
                    stack.push(path);
                } else {
                    out.push(path);
                }
            }
        }
        out
    }

    /// Every file of this namespace that someone other than its owner may write.
    pub fn loose_permissions(&self) -> Vec<(PathBuf, u32)> {
        let mut out = Vec::new();
        let mut paths = self.files_in(Path::new(SHM_DIR));
        let mut stack = vec![self.root()];
        while let Some(dir) = stack.pop() {
            paths.push(dir.clone());
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    paths.push(path);
                }
            }
        }
        for path in paths {
            if let Ok(meta) = std::fs::symlink_metadata(&path) {
                let mode = meta.mode() & 0o777;
                // A file inside the 0700 directory is unreachable to others whatever its
                // own mode; anything directly in /dev/shm must be owner-only itself.
                let reachable = path.parent() == Some(Path::new(SHM_DIR)) || path == self.root();
                if reachable && mode & 0o022 != 0 {
                    out.push((path, mode));
                }
            }
        }
        out
    }

    /// Whether a process of this namespace is alive (its iceoryx2 node's monitor says
    /// so, or cannot tell). Reads the monitors alone, as `Namespace::node_liveness`.
    pub fn has_live_nodes(&self) -> bool {
        self.monitor_states()
            .is_some_and(|states| states.iter().any(|s| *s != Liveness::Gone))
    }

    /// Removes the namespace entirely: its node counter and service directory. Only for
    /// when no process uses the namespace any more (the end of a test).
    pub fn purge(&self) {
        for path in self.files_in(Path::new(SHM_DIR)) {
            let _ = std::fs::remove_file(path);
        }
        let _ = std::fs::remove_dir_all(self.root());
        let _ = std::fs::remove_dir_all(self.state_dir());
    }
}

/// What is known of the process behind an iceoryx2 node (see
/// [`Namespace::node_liveness`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Its monitor says it is alive.
    Alive,
    /// It is dead, or there is no such node (never was, or removed).
    Gone,
    /// It cannot be told right now: its monitor is not readable by this user, or reading
    /// it failed.
    Unknown,
}

/// iceoryx2's node monitors (a file lock each) for the service type Sluice uses.
pub(crate) type NodeMonitor = <Ipc as iceoryx2::service::Service>::Monitoring;

/// What the monitor `name` says, as `Node::state_of` reads it: a node being created,
/// removed or never there has no state (`DoesNotExist`: gone); a monitor that cannot be
/// read (another user's, an interrupted read) tells nothing.
pub(crate) fn monitor_state(
    config: &<NodeMonitor as NamedConceptMgmt>::Configuration,
    name: &FileName,
) -> Liveness {
    match <NodeMonitor as Monitoring>::Builder::new(name)
        .config(config)
        .monitor()
        .map(|m| m.state())
    {
        Ok(Ok(State::Alive)) => Liveness::Alive,
        Ok(Ok(State::Dead | State::DoesNotExist)) => Liveness::Gone,
        Ok(Err(_)) | Err(_) => Liveness::Unknown,
    }
}

/// The bytes free on `/dev/shm` if it is (all but) full: fewer than a node's own
/// segments and files take, a few pages each.
fn shm_full() -> Option<u64> {
    const NODE_ROOM: u64 = 256 << 10;
    shm_available().ok().filter(|free| *free < NODE_ROOM)
}

/// The error of a node that a full `/dev/shm` leaves no room for (iceoryx2 reports it as
/// an internal error, or dies of it).
fn full_shm(role: &str, free: u64) -> SluiceError {
    SluiceError::io(
        format!(
            "cannot create {role} node: {SHM_DIR} is full ({free} bytes free); remove what \
             fills it or enlarge it (e.g. `mount -o remount,size=8G {SHM_DIR}`)"
        ),
        std::io::Error::from(std::io::ErrorKind::StorageFull),
    )
}

/// Free bytes on the shared-memory file system.
pub fn shm_available() -> Result<u64> {
    let path = std::ffi::CString::new(SHM_DIR).map_err(|e| SluiceError::Internal(e.to_string()))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a valid NUL-terminated string and `stat` points to writable
    // memory of the right size; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(SluiceError::io(
            format!("cannot query free space on {SHM_DIR}"),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: statvfs returned 0, so it initialised `stat`.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Creates `dir` owner-only, or checks that it is a directory (not a link) owned by this
/// user, narrowing its mode to owner-only; `otherwise` says what to do when it is not.
pub fn private_dir(dir: &Path, otherwise: &str) -> Result<()> {
    // Owner-only from the start: no moment in which others may enter it.
    let created = {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(dir)
    };
    match created {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(SluiceError::io(
                format!("cannot create {}", dir.display()),
                e,
            ));
        }
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| SluiceError::io(format!("cannot inspect {}", dir.display()), e))?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid {
        return Err(SluiceError::Config(format!(
            "{} is not a directory owned by you (uid {uid}): another user may have made it; \
             remove it or {otherwise}",
            dir.display()
        )));
    }
    if meta.mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| SluiceError::io(format!("cannot restrict {}", dir.display()), e))?;
    }
    Ok(())
}

/// The default namespace of user `uid`: `u<uid>`, unless another user made its service
/// directory (in `base`) or a shared-memory file of its prefix (in `shm`) first, which
/// would deny this user every topic. Then a private name, `u<uid>x` and 6 random hex
/// digits, drawn once and kept in `keep()`'s directory (this user's private one), so
/// that every process of this user takes the same; a warning says so.
pub(crate) fn default_name(
    base: &Path,
    shm: &Path,
    uid: u32,
    keep: impl FnOnce() -> Result<PathBuf>,
) -> Result<String> {
    let name = format!("u{uid}");
    let Some((path, owner)) = taken_by_another(base, shm, &name, uid) else {
        return Ok(name);
    };
    let private = private_name(&keep()?, uid)?;
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "{} belongs to another user (uid {owner}), which would deny you every topic: \
             using the namespace '{private}' instead (kept in your private directory; set \
             SLUICE_NAMESPACE to choose one)",
            path.display()
        )
    });
    Ok(private)
}

/// Whether `file` is one of iceoryx2's files under `prefix` (`iox2_sluice_<name>_`), and
/// not another namespace's whose name only starts with this one's and an underscore
/// (`u1001` and `u1001_x`): after the prefix comes a service's hash (40 hex digits and
/// `_`: the segments in /dev/shm) or a node's or listener's id (digits and `.`: the
/// files of the service directory), which no namespace name of the other's can be (at
/// most 16 characters, no dot).
fn is_file_of(file: &str, prefix: &str) -> bool {
    let Some(rest) = file.strip_prefix(prefix) else {
        return false;
    };
    let hashed = rest.len() > 40
        && rest.as_bytes()[40] == b'_'
        && rest.as_bytes()[..40]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    let id = rest.split_once('.').is_some_and(|(digits, _)| {
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    });
    hashed || id
}

/// Makes `path` owner-only if it is a plain file of this user's: through a descriptor
/// opened without following a link, so that a link another user left under a
/// namespace's prefix never has its target's mode changed.
fn narrow_own_file(path: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return;
    };
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if let Ok(meta) = file.metadata()
        && meta.is_file()
        && meta.uid() == uid
        && meta.mode() & 0o077 != 0
    {
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o600));
    }
}

/// What of namespace `name` another user made (its service directory in `base`, or a
/// shared-memory file of its prefix in `shm`), and that user's uid.
fn taken_by_another(base: &Path, shm: &Path, name: &str, uid: u32) -> Option<(PathBuf, u32)> {
    let root = base.join(format!("sluice-{name}"));
    if let Ok(meta) = std::fs::symlink_metadata(&root)
        && meta.uid() != uid
    {
        return Some((root, meta.uid()));
    }
    let prefix = format!("iox2_sluice_{name}_");
    std::fs::read_dir(shm)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| is_file_of(&e.file_name().to_string_lossy(), &prefix))
        .find_map(|e| {
            let owner = e.metadata().ok()?.uid();
            (owner != uid).then(|| (e.path(), owner))
        })
}

/// The private namespace name kept in `dir` (a private directory), drawn and written
/// there if it is not yet: exclusively, so that processes starting together agree.
fn private_name(dir: &Path, uid: u32) -> Result<String> {
    let path = dir.join("namespace");
    let valid =
        |n: &str| n.starts_with(&format!("u{uid}x")) && n.len() == format!("u{uid}x").len() + 6;
    if let Ok(kept) = std::fs::read_to_string(&path)
        && valid(kept.trim())
    {
        return Ok(kept.trim().to_string());
    }
    let mut random = [0u8; 3];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random))
        .map_err(|e| SluiceError::io("cannot read /dev/urandom", e))?;
    let drawn = format!("u{uid}x{:02x}{:02x}{:02x}", random[0], random[1], random[2]);
    let tmp = dir.join(format!("namespace.tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    use std::os::unix::fs::OpenOptionsExt;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, drawn.as_bytes()));
    // A link fails where the name exists: the first process to draw one wins.
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, &path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(drawn),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let kept = std::fs::read_to_string(&path)
                .map_err(|e| SluiceError::io(format!("cannot read {}", path.display()), e))?;
            if valid(kept.trim()) {
                Ok(kept.trim().to_string())
            } else {
                Err(SluiceError::Config(format!(
                    "{} does not hold a namespace name: remove it, or set SLUICE_NAMESPACE",
                    path.display()
                )))
            }
        }
        Err(e) => Err(SluiceError::io(
            format!("cannot write {}", path.display()),
            e,
        )),
    }
}

/// This user's private directory for what other local users must not read (a loopback
/// Flight server's token): `sluice-u<uid>` in `$XDG_RUNTIME_DIR` where it is set, else
/// in the temporary directory; created owner-only, or checked to be this user's own
/// directory (not a link) and narrowed to owner-only, as the state directory is.
pub fn user_dir() -> Result<PathBuf> {
    let dir = user_dir_path();
    private_dir(
        &dir,
        "set TMPDIR or XDG_RUNTIME_DIR to a directory of your own",
    )?;
    Ok(dir)
}

/// [`user_dir`] if it exists as that (this user's, not a link, owner-only), without
/// creating it: for readers.
pub fn existing_user_dir() -> Option<PathBuf> {
    let dir = user_dir_path();
    let meta = std::fs::symlink_metadata(&dir).ok()?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    (meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0).then_some(dir)
}

fn user_dir_path() -> PathBuf {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute() && dir.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    base.join(format!("sluice-u{uid}"))
}

/// Writes `bytes` to `path` (in a private directory) as a new file of this user's, then
/// renames it to `to`: never through a link someone left at `path`.
pub fn write_private(path: &Path, to: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_private_file(path, to, bytes, false).map(drop)
}

/// [`write_private`], the file locked (`flock`, exclusive) before anything is written
/// in it: the lock is the returned file's, and the kernel lets go of it when the file
/// is closed, however the process ends, so that others can tell a live writer's file
/// from one a killed process left.
pub fn write_private_locked(path: &Path, to: &Path, bytes: &[u8]) -> std::io::Result<File> {
    write_private_file(path, to, bytes, true)
}

fn write_private_file(path: &Path, to: &Path, bytes: &[u8], lock: bool) -> std::io::Result<File> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // A leftover (or a link) goes; removing a link removes the link, not its target.
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    if lock {
        file.try_lock().map_err(std::io::Error::from)?;
    }
    file.write_all(bytes)?;
    std::fs::rename(path, to)?;
    Ok(file)
}

/// Reclaims the namespace's dead processes when dropped, if `due`: the last field of a
/// port's owner (and, for a subscriber, shared with the samples it handed out), so that
/// it runs once the owner and everything it handed out have let go of the topic.
/// [`Namespace::reclaim_dead`] keeps a dead producer's resources while anything holds
/// its services, so the last holder to go may be the only one left to remove them.
#[derive(Debug)]
pub(crate) struct ReclaimAfter {
    pub(crate) namespace: Namespace,
    pub(crate) due: std::sync::atomic::AtomicBool,
    owner: crate::process::Owner,
}

impl ReclaimAfter {
    pub(crate) fn new(namespace: &Namespace, due: bool) -> Self {
        Self {
            namespace: namespace.clone(),
            due: std::sync::atomic::AtomicBool::new(due),
            owner: crate::process::Owner::this(),
        }
    }
}

impl Drop for ReclaimAfter {
    fn drop(&mut self) {
        // Not in a forked child, which drops its copy of its parent's subscriber or
        // publisher: the reclaim was due to the parent (see `crate::process`).
        if *self.due.get_mut() && self.owner.is_here() {
            self.namespace.reclaim_dead();
        }
    }
}
