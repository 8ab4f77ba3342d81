//! Object stores for remote `LOCATION`s: `s3://`, `gs://`, `az://`, `http(s)://`.
//!
//! Before a `CREATE EXTERNAL TABLE` with a remote location runs, the store for its
//! bucket (or host) is built from the standard environment variables (`AWS_*`,
//! `GOOGLE_*`, `AZURE_*`, through object_store's `from_env`) and the table's
//! `OPTIONS ('aws.<key>' '<value>', …)`, then registered on the session. The store keys
//! are taken out of the table's options (DataFusion never sees them, so they cannot
//! show up in its plans or messages), and every secret value is remembered so that
//! Sluice can blank it out of any message it prints.
//!
//! The location is then probed (one `HEAD` or one `LIST` page) so that a missing
//! bucket, a missing object or refused credentials are reported against the URL, with
//! what to check, before DataFusion plans anything.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as StorePath;
use object_store::{
    BackoffConfig, ClientConfigKey, CopyOptions, GetOptions, GetResult, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions,
    PutPayload, PutResult, RetryConfig,
};
use url::Url;

/// The families of remote stores Sluice configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Aws,
    Gcp,
    Azure,
    Http,
}

impl Family {
    fn of(scheme: &str) -> Option<Self> {
        match scheme {
            "s3" | "s3a" => Some(Self::Aws),
            "gs" | "gcs" => Some(Self::Gcp),
            "az" | "azure" | "abfs" | "abfss" | "adl" => Some(Self::Azure),
            "http" | "https" => Some(Self::Http),
            _ => None,
        }
    }

    /// The prefix of this family's keys in `OPTIONS`.
    fn prefix(self) -> &'static str {
        match self {
            Self::Aws => "aws",
            Self::Gcp => "gcp",
            Self::Azure => "azure",
            Self::Http => "http",
        }
    }

    /// The environment variables the family reads, for messages.
    fn env_hint(self) -> &'static str {
        match self {
            Self::Aws => {
                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or OPTIONS 'aws.access_key_id', 'aws.secret_access_key')"
            }
            Self::Gcp => {
                "GOOGLE_SERVICE_ACCOUNT / GOOGLE_SERVICE_ACCOUNT_KEY (or OPTIONS 'gcp.service_account_key')"
            }
            Self::Azure => {
                "AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY (or OPTIONS 'azure.account_key')"
            }
            Self::Http => "the server's access rules",
        }
    }
}

/// The store prefixes recognised in table `OPTIONS`.
const PREFIXES: [&str; 4] = ["aws.", "gcp.", "azure.", "http."];

/// Retry policy for transient store errors (timeouts, connection resets, 5xx, 429).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    /// Retries of one request before giving up.
    pub max_retries: usize,
    /// Give up retrying a request after this long.
    pub timeout: Duration,
}

impl Retry {
    fn config(self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(15),
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: self.timeout,
        }
    }
}

/// Values that must never be printed (keys, tokens), collected from the environment
/// and from table options.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Vec<String>);

// By hand: the values are what must never be printed.
impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} values)", self.0.len())
    }
}

impl Secrets {
    /// Adds the values that follow a secret key (`'aws.secret_access_key' 'value'`,
    /// with or without quotes or `=`) anywhere in `sql`, read from its tokens before it
    /// is parsed: a syntax error, found before any statement is planned, can quote
    /// them.
    pub(crate) fn add_literals(&mut self, sql: &str) {
        use datafusion::sql::sqlparser::dialect::GenericDialect;
        use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
        let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
            return;
        };
        // Option keys are quoted ('aws.secret_access_key') or dotted words
        // (aws.secret_access_key): a plain word (a column named `key`) is no option.
        let mut items: Vec<(String, bool)> = Vec::new();
        let mut dotted = false;
        for token in tokens.iter().filter(|t| !matches!(t, Token::Whitespace(_))) {
            match token {
                Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => {
                    items.push((s.clone(), true))
                }
                Token::Word(w) if dotted => {
                    if let Some((last, is_key)) = items.last_mut() {
                        last.push('.');
                        last.push_str(&w.value);
                        *is_key = true;
                    }
                }
                Token::Word(w) => items.push((w.value.clone(), false)),
                Token::Period => {}
                Token::Eq => continue,
                _ => items.push((String::new(), false)),
            }
            dotted = matches!(token, Token::Period);
        }
        for pair in items.windows(2) {
            if pair[0].1 && is_secret_key(&pair[0].0) {
                self.add(&pair[1].0);
            }
        }
    }

    fn add(&mut self, value: &str) {
        // Very short values ("1", "true") are no secret and would blank out too much.
        if value.len() >= 6 && !self.0.iter().any(|s| s == value) {
            self.0.push(value.to_string());
            // Longest first, so a secret containing another is blanked whole.
            self.0.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// `message` with every known secret replaced by `***`.
    pub fn redact(&self, message: &str) -> String {
        let mut out = message.to_string();
        for s in &self.0 {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "***");
            }
        }
        out
    }
}

/// Whether an option or environment variable holds a secret.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["secret", "token", "password", "sas", "credential"]
        .iter()
        .any(|w| key.contains(w))
        || (key.contains("key") && !key.contains("key_id") && !key.ends_with("key_file"))
}

/// Adds the secret values of the store environment variables to `secrets`.
pub(crate) fn env_secrets(secrets: &mut Secrets) {
    for (k, v) in std::env::vars() {
        let upper = k.to_ascii_uppercase();
        if (upper.starts_with("AWS_")
            || upper.starts_with("GOOGLE_")
            || upper.starts_with("AZURE_"))
            && is_secret_key(&upper)
        {
            secrets.add(&v);
        }
    }
}

/// Removes the store keys (`aws.*`, `gcp.*`, `azure.*`, `http.*`) from a table's
/// options and returns them, recording secret values in `secrets`.
pub(crate) fn take_store_options(
    options: &mut HashMap<String, String>,
    secrets: &mut Secrets,
) -> Vec<(String, String)> {
    let keys: Vec<String> = options
        .keys()
        .filter(|k| {
            let k = k.to_ascii_lowercase();
            PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .cloned()
        .collect();
    let mut taken: Vec<(String, String)> = keys
        .into_iter()
        .filter_map(|k| options.remove_entry(&k))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    taken.sort();
    for (k, v) in &taken {
        if is_secret_key(k) {
            secrets.add(v);
        }
    }
    taken
}

/// The remote locations among `locations`, with their family.
fn remote(location: &str) -> Option<(Url, Family)> {
    let url = Url::parse(location).ok()?;
    let family = Family::of(url.scheme())?;
    Some((url, family))
}

/// Builds and registers the object store for `location` (when it is remote), then
/// probes the location. Returns `Ok(false)` for local locations.
pub(crate) async fn register(
    ctx: &datafusion::prelude::SessionContext,
    location: &str,
    store_options: &[(String, String)],
    retry: Retry,
    counters: &Arc<Counters>,
) -> Result<bool, StoreError> {
    let Some((url, family)) = remote(location) else {
        if let Some((key, _)) = store_options.first() {
            return Err(StoreError::config(
                location,
                format!(
                    "option '{key}' configures an object store, but '{location}' is not an \
                     s3://, gs://, az:// or http(s):// location"
                ),
            ));
        }
        return Ok(false);
    };
    let host = url.host_str().unwrap_or_default();
    if host.is_empty() {
        return Err(StoreError::config(
            location,
            format!(
                "'{location}' names no {}; write {}://<bucket>/<path>",
                if family == Family::Http {
                    "host"
                } else {
                    "bucket"
                },
                url.scheme()
            ),
        ));
    }
    let mut keys = Vec::new();
    for (key, value) in store_options {
        let Some(name) = key
            .strip_prefix(family.prefix())
            .and_then(|k| k.strip_prefix('.'))
        else {
            return Err(StoreError::config(
                location,
                format!(
                    "option '{key}' does not apply to a {}:// location; its options start with '{}.'",
                    url.scheme(),
                    family.prefix()
                ),
            ));
        };
        keys.push((name.to_string(), value.clone()));
    }
    let store =
        build(&url, family, &keys, retry.config()).map_err(|e| StoreError::config(location, e))?;
    let store: Arc<dyn ObjectStore> = Arc::new(Counting::new(store, counters.clone()));
    let base = store_base(&url);
    ctx.register_object_store(&base, store.clone());
    probe(store.as_ref(), &url, family).await?;
    Ok(true)
}

/// `scheme://host[:port]`: the URL DataFusion looks stores up by.
fn store_base(url: &Url) -> Url {
    let mut base = url.clone();
    base.set_path("");
    base.set_query(None);
    base.set_fragment(None);
    base
}

fn unknown_key(family: Family, key: &str, valid: &str) -> String {
    format!(
        "unknown option '{}.{key}'; valid keys include: {valid} (see object_store's {} for all)",
        family.prefix(),
        match family {
            Family::Aws => "AmazonS3ConfigKey",
            Family::Gcp => "GoogleConfigKey",
            Family::Azure => "AzureConfigKey",
            Family::Http => "ClientConfigKey",
        }
    )
}

fn build(
    url: &Url,
    family: Family,
    keys: &[(String, String)],
    retry: RetryConfig,
) -> Result<Arc<dyn ObjectStore>, String> {
    let message = |e: object_store::Error| e.to_string();
    let store: Arc<dyn ObjectStore> = match family {
        Family::Aws => {
            let mut b = AmazonS3Builder::from_env().with_url(url.as_str());
            for (k, v) in keys {
                let key = AmazonS3ConfigKey::from_str(k).map_err(|_| {
                    unknown_key(
                        family,
                        k,
                        "access_key_id, secret_access_key, session_token, region, endpoint, \
                         allow_http, virtual_hosted_style_request, skip_signature",
                    )
                })?;
                b = b.with_config(key, v);
            }
            refuse_plain_http(&b)?;
            Arc::new(b.with_retry(retry).build().map_err(message)?)
        }
        Family::Gcp => {
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
            for (k, v) in keys {
                let key = GoogleConfigKey::from_str(k).map_err(|_| {
                    unknown_key(
                        family,
                        k,
                        "service_account, service_account_key, application_credentials",
                    )
                })?;
                b = b.with_config(key, v);
            }
            Arc::new(b.with_retry(retry).build().map_err(message)?)
        }
        Family::Azure => {
            let mut b = MicrosoftAzureBuilder::from_env().with_url(url.as_str());
            for (k, v) in keys {
                let key = AzureConfigKey::from_str(k).map_err(|_| {
                    unknown_key(
                        family,
                        k,
                        "account_name, account_key, client_id, client_secret, tenant_id, \
                         sas_key, endpoint, use_emulator",
                    )
                })?;
                b = b.with_config(key, v);
            }
            Arc::new(b.with_retry(retry).build().map_err(message)?)
        }
        Family::Http => {
            let mut b = HttpBuilder::new().with_url(store_base(url).as_str());
            if url.scheme() == "http" {
                b = b.with_config(ClientConfigKey::AllowHttp, "true");
            }
            for (k, v) in keys {
                let key = ClientConfigKey::from_str(k).map_err(|_| {
                    unknown_key(
                        family,
                        k,
                        "allow_http, allow_invalid_certificates, timeout, connect_timeout, user_agent",
                    )
                })?;
                b = b.with_config(key, v);
            }
            Arc::new(b.with_retry(retry).build().map_err(message)?)
        }
    };
    Ok(store)
}

/// Checks that the location exists and can be read: one `HEAD` for an object, one
/// `LIST` page for a prefix (a location ending in `/`, or one that is no object).
async fn probe(store: &dyn ObjectStore, url: &Url, family: Family) -> Result<(), StoreError> {
    let path = StorePath::from_url_path(url.path())
        .map_err(|e| StoreError::config(url.as_str(), e.to_string()))?;
    if !url.path().ends_with('/') && !path.as_ref().is_empty() {
        match store.head(&path).await {
            Ok(_) => return Ok(()),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(StoreError::from_store(url.as_str(), family, e)),
        }
    }
    // HTTP servers generally cannot list.
    if family == Family::Http {
        return Err(StoreError {
            url: url.to_string(),
            message: "no such object (404); check the URL".into(),
        });
    }
    let prefix = (!path.as_ref().is_empty()).then_some(&path);
    match store.list(prefix).next().await {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(StoreError::from_store(url.as_str(), family, e)),
        None => Err(StoreError {
            url: url.to_string(),
            message: missing_message(url),
        }),
    }
}

/// What a location that names nothing is told: a pattern, a query or a fragment is
/// part of an object's name on object storage (DataFusion matches globs in local paths
/// only), and `%xx` stands for the character it encodes.
fn missing_message(url: &Url) -> String {
    let mut message =
        "no such object, and no objects under this prefix; check the bucket and the path"
            .to_string();
    let path = url.path();
    if path.contains(['*', '[']) || path.contains("%5B") {
        message.push_str(
            "; a glob is read only in a local path: on object storage name the prefix \
             (`s3://bucket/dir/`) or each object (several LOCATIONs)",
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        message.push_str("; `?` and `#` end the object's name in a URL: write them as %3F and %23");
    }
    message
}

/// An `http://` endpoint is refused by object_store unless allowed, at the first
/// request and as a bare "builder error": said here, with the setting that allows it.
fn refuse_plain_http(b: &AmazonS3Builder) -> std::result::Result<(), String> {
    // The endpoint object_store connects to: the S3-specific one first.
    let endpoint = b
        .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
        .or_else(|| b.get_config_value(&AmazonS3ConfigKey::Endpoint));
    // What object_store takes for true.
    let allowed = b
        .get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
        .is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "on" | "yes" | "y"
            )
        });
    match endpoint {
        Some(e) if e.to_ascii_lowercase().starts_with("http://") && !allowed => Err(format!(
            "the endpoint {e} is plain HTTP, which is refused unless allowed: set \
             AWS_ALLOW_HTTP=true or OPTIONS ('aws.allow_http' 'true') (a local test server), \
             or use https"
        )),
        _ => Ok(()),
    }
}

/// A store failure against a URL, with what to check.
#[derive(Debug)]
pub(crate) struct StoreError {
    pub url: String,
    pub message: String,
}

impl StoreError {
    fn config(url: &str, message: impl Into<String>) -> Self {
        Self {
            url: url.to_string(),
            message: message.into(),
        }
    }

    fn from_store(url: &str, family: Family, e: object_store::Error) -> Self {
        let why = sluice_core::error::with_causes(&e);
        let message = match classify(&e) {
            Kind::NotFound => {
                format!("not found (check that the bucket and the object exist): {why}")
            }
            Kind::Denied => format!(
                "access denied (check the credentials: {}): {e}",
                family.env_hint()
            ),
            // object_store says when it retried (`after N retries`), and the cause.
            Kind::Other => format!("cannot read: {why}"),
        };
        Self {
            url: url.to_string(),
            message,
        }
    }
}

/// What a store error means for the user.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    NotFound,
    Denied,
    Other,
}

/// Classifies a store error. object_store types some failures (`NotFound`,
/// `PermissionDenied`, …) but reports others, such as a refused `LIST`, as `Generic`
/// with the HTTP status in the message, so the message is read as well.
fn classify(e: &object_store::Error) -> Kind {
    match e {
        object_store::Error::NotFound { .. } => return Kind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => return Kind::Denied,
        _ => {}
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&s.to_string());
        source = s.source();
    }
    const DENIED: [&str; 6] = [
        "403 Forbidden",
        "401 Unauthorized",
        "AccessDenied",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "AuthorizationHeaderMalformed",
    ];
    const NOT_FOUND: [&str; 3] = ["404 Not Found", "NoSuchBucket", "NoSuchKey"];
    if DENIED.iter().any(|d| text.contains(d)) {
        Kind::Denied
    } else if NOT_FOUND.iter().any(|d| text.contains(d)) {
        Kind::NotFound
    } else {
        Kind::Other
    }
}

/// The file formats whose objects [`find_corrupt`] can judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileFormat {
    Parquet,
    Arrow,
}

impl FileFormat {
    /// The format of a table `STORED AS` `file_type`, where it is one of these.
    pub(crate) fn of(file_type: &str) -> Option<Self> {
        match file_type.to_ascii_uppercase().as_str() {
            "PARQUET" => Some(Self::Parquet),
            "ARROW" => Some(Self::Arrow),
            _ => None,
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Self::Parquet => ".parquet",
            Self::Arrow => ".arrow",
        }
    }
}

/// Looks for the first object under a location whose framing is not its format's (a
/// Parquet footer without `PAR1`, a metadata length beyond the object, metadata that
/// does not decode; an Arrow IPC file without its `ARROW1` marks or a footer that does
/// not decode), to name it and say what is wrong when DataFusion could not read the
/// table. Costs one `LIST` and a few small ranged `GET`s per object, only after a
/// failure.
pub(crate) async fn find_corrupt(
    ctx: &datafusion::prelude::SessionContext,
    location: &str,
    format: FileFormat,
) -> Option<(String, String)> {
    let table_url = datafusion::datasource::listing::ListingTableUrl::parse(location).ok()?;
    let store = ctx
        .runtime_env()
        .object_store(table_url.object_store())
        .ok()?;
    let prefix = table_url.prefix().clone();
    let mut objects = store.list(Some(&prefix));
    let extension = format.extension();
    // DataFusion reads every object under a remote prefix as the table's format, but
    // only the files of its extension in a local directory; it passes over empty ones.
    let every_object = table_url.scheme() != "file";
    while let Some(Ok(meta)) = objects.next().await {
        let named = meta.location.as_ref().ends_with(extension) || location.ends_with(extension);
        if meta.size == 0 || !(named || every_object) {
            continue;
        }
        let fault = match format {
            FileFormat::Parquet => parquet_footer_fault(store.as_ref(), &meta).await,
            FileFormat::Arrow => arrow_file_fault(store.as_ref(), &meta).await,
        };
        if let Some(why) = fault {
            let base = table_url.object_store();
            return Some((format!("{}{}", base.as_str(), meta.location.as_ref()), why));
        }
    }
    None
}

/// What is wrong with the framing of the Arrow IPC object `meta`, if anything: a file
/// starts and ends with `ARROW1`, and its footer, before the last 10 bytes, decodes (a
/// stream, starting with a continuation mark, is left to its reader).
async fn arrow_file_fault(
    store: &dyn ObjectStore,
    meta: &object_store::ObjectMeta,
) -> Option<String> {
    const MAGIC: &[u8] = b"ARROW1";
    const TAIL: u64 = 10;
    let size = meta.size;
    if size < 8 {
        return Some(format!("not an Arrow IPC file ({size} bytes, too short)"));
    }
    let head = store.get_range(&meta.location, 0..8).await.ok()?;
    if head.len() != 8 {
        return Some(shorter_than_listed(size, head.len()));
    }
    if head.starts_with(&[0xff; 4]) {
        return None;
    }
    if size < 18 || !head.starts_with(MAGIC) {
        return Some("not an Arrow IPC file (no ARROW1 at its start)".into());
    }
    let tail = store
        .get_range(&meta.location, size - TAIL..size)
        .await
        .ok()?;
    if tail.len() as u64 != TAIL {
        return Some(shorter_than_listed(size, tail.len()));
    }
    if &tail[4..] != MAGIC {
        return Some("a truncated Arrow IPC file (no ARROW1 at its end)".into());
    }
    let length = u64::try_from(i32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]])).ok();
    let Some(start) = length
        .and_then(|l| size.checked_sub(TAIL + l))
        .filter(|&s| s >= 8)
    else {
        return Some(format!(
            "a corrupt Arrow IPC file (its footer length {} does not fit its {size} bytes)",
            i32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]])
        ));
    };
    let footer = store
        .get_range(&meta.location, start..size - TAIL)
        .await
        .ok()?;
    match arrow::ipc::root_as_footer(&footer) {
        Ok(_) => None,
        Err(e) => Some(format!("a corrupt Arrow IPC file (its footer: {e})")),
    }
}

/// What an object whose ranged read came back short is: smaller than its listing said,
/// so replaced or truncated since it was listed.
fn shorter_than_listed(size: u64, got: usize) -> String {
    format!(
        "shorter than its listing's {size} bytes (a read of its last bytes returned {got}): it \
         changed after it was listed; rerun once it is complete"
    )
}

/// What is wrong with the footer of the Parquet object `meta`, if anything (an object
/// that cannot be fetched is not judged).
async fn parquet_footer_fault(
    store: &dyn ObjectStore,
    meta: &object_store::ObjectMeta,
) -> Option<String> {
    const FOOTER: u64 = 8;
    let size = meta.size;
    if size < 12 {
        return Some(format!("not a Parquet file ({size} bytes, too short)"));
    }
    let tail = store
        .get_range(&meta.location, size - FOOTER..size)
        .await
        .ok()?;
    if tail.len() as u64 != FOOTER {
        return Some(shorter_than_listed(size, tail.len()));
    }
    if &tail[4..8] != b"PAR1" {
        return Some("not a Parquet file (no PAR1 footer)".into());
    }
    let length = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    let Some(start) = size.checked_sub(FOOTER + length).filter(|&s| s >= 4) else {
        return Some(format!(
            "a corrupt Parquet file (its footer gives {length} bytes of metadata; the file has \
             {size})"
        ));
    };
    let metadata = store
        .get_range(&meta.location, start..size - FOOTER)
        .await
        .ok()?;
    // The decoder may panic on hostile metadata: that too says the file is corrupt.
    let decoded = sluice_core::panics::catch(|| {
        parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&metadata)
    });
    match decoded {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(format!("a corrupt Parquet file (its metadata: {e})")),
        Err(panic) => Some(format!("a corrupt Parquet file (its metadata: {panic})")),
    }
}

/// Requests and bytes read through the object stores of one plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// `GET` requests (whole objects or byte ranges).
    pub gets: u64,
    /// `HEAD` requests.
    pub heads: u64,
    /// `LIST` calls (one per listing, whatever its number of pages).
    pub lists: u64,
    /// Bytes returned by `GET` requests.
    pub bytes: u64,
}

/// Counters shared by the counting stores of a plan, and the cutoff of their listings.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    gets: AtomicU64,
    heads: AtomicU64,
    lists: AtomicU64,
    bytes: AtomicU64,
    /// Listings leave out objects modified after this many microseconds since the Unix
    /// epoch; 0: none left out (a round's snapshot, see [`crate::rounds`]).
    listed_before_us: AtomicI64,
    /// Listings keep only these paths (`None`: any).
    only: std::sync::RwLock<Option<std::collections::HashSet<String>>>,
}

impl Counters {
    /// Leaves objects modified after `cutoff` out of every listing from now on.
    pub fn set_cutoff(&self, cutoff: std::time::SystemTime) {
        let us = cutoff.duration_since(std::time::UNIX_EPOCH).map_or(1, |d| {
            i64::try_from(d.as_micros()).unwrap_or(i64::MAX).max(1)
        });
        self.listed_before_us.store(us, Ordering::Relaxed);
    }

    /// Leaves every object but `paths` out of every listing from now on.
    pub fn set_only(&self, paths: &[String]) {
        let set = paths.iter().cloned().collect();
        *self.only.write().unwrap_or_else(PoisonError::into_inner) = Some(set);
    }

    /// Whether a listing keeps `meta` (see [`Counters::set_cutoff`], [`Counters::set_only`]).
    fn listed(&self, meta: &ObjectMeta) -> bool {
        let cutoff = self.listed_before_us.load(Ordering::Relaxed);
        let recent = cutoff != 0 && meta.last_modified.timestamp_micros() > cutoff;
        let only = self.only.read().unwrap_or_else(PoisonError::into_inner);
        !recent
            && only
                .as_ref()
                .is_none_or(|set| set.contains(meta.location.as_ref()))
    }

    pub fn snapshot(&self) -> StoreStats {
        StoreStats {
            gets: self.gets.load(Ordering::Relaxed),
            heads: self.heads.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

/// An object store that counts the requests made through it (for `sluice run`'s
/// summary and the benchmarks), and otherwise passes everything on.
#[derive(Debug)]
pub(crate) struct Counting {
    inner: Arc<dyn ObjectStore>,
    counters: Arc<Counters>,
}

impl Counting {
    pub fn new(inner: Arc<dyn ObjectStore>, counters: Arc<Counters>) -> Self {
        Self { inner, counters }
    }
}

impl std::fmt::Display for Counting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Counting {
    async fn put_opts(
        &self,
        location: &StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &StorePath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &StorePath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let head = options.head;
        let result = self.inner.get_opts(location, options).await;
        if head {
            self.counters.heads.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.gets.fetch_add(1, Ordering::Relaxed);
            if let Ok(r) = &result {
                self.counters
                    .bytes
                    .fetch_add(r.range.end - r.range.start, Ordering::Relaxed);
            }
        }
        result
    }

    // `get_ranges` is left to the trait's default, which coalesces nearby ranges and
    // sends each through `get_opts` above, so that every request is counted.

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<StorePath>>,
    ) -> BoxStream<'static, object_store::Result<StorePath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&StorePath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        let counters = self.counters.clone();
        self.inner
            .list(prefix)
            .try_filter(move |m| std::future::ready(counters.listed(m)))
            .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&StorePath>,
        offset: &StorePath,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        let counters = self.counters.clone();
        self.inner
            .list_with_offset(prefix, offset)
            .try_filter(move |m| std::future::ready(counters.listed(m)))
            .boxed()
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&StorePath>,
    ) -> object_store::Result<ListResult> {
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        let mut result = self.inner.list_with_delimiter(prefix).await?;
        result.objects.retain(|m| self.counters.listed(m));
        Ok(result)
    }

    async fn copy_opts(
        &self,
        from: &StorePath,
        to: &StorePath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// The remote object stores a plan declared, as a session option: how a Ballista job
/// carries them to a cluster's scheduler and executors, which build the same stores
/// (`sluice ballista scheduler` / `executor`; see [`StoreSpecs::register`]).
///
/// One entry, `sluice_stores.json`: a JSON list of `{"location", "options",
/// "retries", "retry_timeout_s"}`. The options are the table's `aws.*`, `gcp.*`,
/// `azure.*` and `http.*` keys, credentials included: they travel in the job's settings.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreSpecs {
    json: String,
}

// By hand: the specs hold credentials.
impl std::fmt::Debug for StoreSpecs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreSpecs(<redacted>)")
    }
}

impl StoreSpecs {
    /// Records the store of `location`, built from `options` and retried per `retry`.
    pub(crate) fn add(&mut self, location: &str, options: &[(String, String)], retry: Retry) {
        let mut list: Vec<serde_json::Value> = serde_json::from_str(&self.json).unwrap_or_default();
        list.push(serde_json::json!({
            "location": location,
            "options": options,
            "retries": retry.max_retries,
            "retry_timeout_s": retry.timeout.as_secs(),
        }));
        self.json = serde_json::Value::Array(list).to_string();
    }

    /// Whether no store is recorded.
    pub fn is_empty(&self) -> bool {
        self.json.is_empty() || self.json == "[]"
    }

    /// Builds every recorded store (credentials from the options, then from this
    /// process's environment) and registers it in `runtime`.
    pub fn register(
        &self,
        runtime: &datafusion::execution::runtime_env::RuntimeEnv,
    ) -> Result<(), String> {
        if self.is_empty() {
            return Ok(());
        }
        let list: Vec<serde_json::Value> = serde_json::from_str(&self.json)
            .map_err(|e| format!("sluice_stores.json is not a JSON list: {e}"))?;
        for spec in list {
            let location = spec["location"]
                .as_str()
                .ok_or("sluice_stores.json: an entry has no location")?;
            let (url, family) = remote(location).ok_or_else(|| {
                format!("sluice_stores.json: '{location}' is not a remote location")
            })?;
            let options: Vec<(String, String)> = serde_json::from_value(spec["options"].clone())
                .map_err(|e| format!("sluice_stores.json: bad options for '{location}': {e}"))?;
            let keys: Vec<(String, String)> = options
                .into_iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix(family.prefix())
                        .and_then(|k| k.strip_prefix('.'))
                        .map(|k| (k.to_string(), v))
                })
                .collect();
            let retry = Retry {
                max_retries: spec["retries"].as_u64().unwrap_or(10) as usize,
                timeout: Duration::from_secs(spec["retry_timeout_s"].as_u64().unwrap_or(120)),
            };
            let store = build(&url, family, &keys, retry.config())
                .map_err(|e| format!("cannot build the object store of '{location}': {e}"))?;
            runtime.register_object_store(&store_base(&url), store);
        }
        Ok(())
    }
}

impl datafusion::common::config::ConfigExtension for StoreSpecs {
    const PREFIX: &'static str = "sluice_stores";
}

impl datafusion::common::config::ExtensionOptions for StoreSpecs {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn cloned(&self) -> Box<dyn datafusion::common::config::ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> datafusion::common::Result<()> {
        let key = key.strip_prefix("sluice_stores.").unwrap_or(key);
        if key != "json" {
            return Err(datafusion::error::DataFusionError::Configuration(format!(
                "unknown option sluice_stores.{key}; the only one is sluice_stores.json"
            )));
        }
        serde_json::from_str::<Vec<serde_json::Value>>(value).map_err(|e| {
            datafusion::error::DataFusionError::Configuration(format!(
                "sluice_stores.json must be a JSON list: {e}"
            ))
        })?;
        self.json = value.to_string();
        Ok(())
    }

    fn entries(&self) -> Vec<datafusion::common::config::ConfigEntry> {
        // Named in full (see `FunctionContext`): a Ballista job sets its entries by name.
        vec![datafusion::common::config::ConfigEntry {
            key: "sluice_stores.json".into(),
            value: (!self.is_empty()).then(|| self.json.clone()),
            description: "The plan's remote object stores, for a Ballista cluster.",
        }]
    }
}
