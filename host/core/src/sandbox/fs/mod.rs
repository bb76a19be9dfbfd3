//! The filesystem a tool sees: wasmtime-wasi's `wasi:filesystem`, behind a guard that enforces
//! the call's [`FsPolicy`].
//!
//! [`GuardedFs`] implements the `wasi:filesystem` host traits by checking each operation and
//! then handing it to wasmtime-wasi's implementation, which resolves paths inside the grants
//! (no `..` escape, no symlink out). The guard adds what the effect class and the budget say:
//! - a **read-only** tool may not change anything (its grants are also mounted read-only);
//! - only a **destructive** tool may remove, or rename away, a file or directory that existed
//!   when the call began; what the call itself created it may remove freely. Objects are told
//!   apart by identity (device and inode, through `metadata-hash`), so a rename cannot hide an
//!   old file as a new one. Replacing an existing *file* by renaming a new one onto it is a
//!   rewrite and allowed, as truncating and rewriting it is;
//! - bytes written and file growth (a write past the end counts the hole too, so a sparse file
//!   counts its logical size) are charged against the **write quota**; past it the write fails
//!   with `insufficient-space`;
//! - objects created (files, directories, links) are capped; past it creation fails with
//!   `quota`.
//!
//! Refusals are errors the guest sees, and each is listed in the call's [`FsReport`].
//!
//! Why one file of ~600 lines: half of it is one trait implementation — wasi:filesystem's
//! `descriptor` resource, some thirty methods, each a check and a hand-off — which Rust keeps in
//! one `impl` block; the write meter and its metered stream are `meter.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::bindings::filesystem::preopens;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, DescriptorFlags, ErrorCode, HostDescriptor, HostDirectoryEntryStream, OpenFlags,
    PathFlags,
};
use wasmtime_wasi::p2::{DynOutputStream, FsError, FsResult};

mod meter;
mod preimage;
mod reach;

use meter::{Meter, MeteredStream};
pub use preimage::{Captured, PreImages, UndoBounds};

use super::descriptors::Descriptors;
use crate::home::Boundary;

/// Refusals listed one by one in a report; past it they are only counted.
pub const MAX_DENIALS_LISTED: usize = 32;

/// What the filesystem layer enforces during one call (decided by the ToolService from the
/// tool's effect class and the session's budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsPolicy {
    /// Refuse every change (a `read-only` tool).
    pub read_only: bool,
    /// May remove or rename away what existed before the call (a `destructive` tool).
    pub remove_existing: bool,
    /// Bytes the call may write, growth included.
    pub write_quota: u64,
    /// Files, directories and links the call may create.
    pub max_created: u64,
    /// Keep the pre-image of what the call changes, within these bounds (`None`: keep none).
    pub undo: Option<UndoBounds>,
}

impl FsPolicy {
    /// Nothing may change (a call with no grants, or `describe`).
    pub fn read_only() -> Self {
        Self { read_only: true, remove_existing: false, write_quota: 0, max_created: 0, undo: None }
    }
}

/// What the filesystem layer saw and refused during one call.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FsReport {
    /// Bytes charged against the write quota (written, plus holes left by writes past the end).
    pub bytes_written: u64,
    /// Files, directories and links created.
    pub files_created: u64,
    /// Operations refused by the effect class (`unlink /w/a.txt: …`), at most
    /// `MAX_DENIALS_LISTED`.
    pub denied: Vec<String>,
    /// Refusals past the listed ones.
    #[serde(skip_serializing_if = "is_zero")]
    pub denied_dropped: u64,
    /// A write was refused because the call's write quota was used up.
    pub write_quota_exceeded: bool,
    /// A creation was refused because the call created as many objects as it may.
    pub create_limit_exceeded: bool,
    /// What the call's changes replaced (kept only where the policy asks for it).
    #[serde(skip)]
    pub preimages: PreImages,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the guard needs of the world outside the call: the call's grants, the home no tool
/// may reach, and the process's share of descriptors.
#[derive(Debug, Clone)]
pub struct FsReach {
    /// The call's grants, by guest path, as opened for it.
    pub grants: Vec<(String, Arc<cap_std::fs::Dir>)>,
    /// The keel home's identities (`None`: a call outside any home, as in some tests).
    pub boundary: Option<Arc<Boundary>>,
    pub descriptors: Arc<Descriptors>,
}

/// The per-call state of the guard.
#[derive(Debug)]
pub struct FsGuard {
    policy: FsPolicy,
    /// Identities (`metadata-hash`) of what this call created.
    created: HashSet<(u64, u64)>,
    created_count: u64,
    meter: Arc<Meter>,
    report: FsReport,
    boundary: Option<Arc<Boundary>>,
    /// The call's grants, by guest path.
    grants: Vec<(String, Arc<cap_std::fs::Dir>)>,
    descriptors: Arc<Descriptors>,
    /// Per open guest descriptor (its resource's index): the grant it lies in, and the
    /// descriptor it holds of the process's share (a preopen's is the call's).
    held: HashMap<u32, (Option<usize>, Option<tokio::sync::OwnedSemaphorePermit>)>,
    /// What the call's changes replaced so far.
    preimages: PreImages,
}

impl FsGuard {
    pub fn new(policy: FsPolicy, reach: FsReach) -> Self {
        Self {
            policy,
            created: HashSet::new(),
            created_count: 0,
            meter: Arc::new(Meter {
                charged: AtomicU64::new(0),
                quota: policy.write_quota,
                exceeded: AtomicBool::new(false),
            }),
            report: FsReport::default(),
            boundary: reach.boundary,
            grants: reach.grants,
            descriptors: reach.descriptors,
            held: HashMap::new(),
            preimages: PreImages::default(),
        }
    }

    /// The grant a guest descriptor lies in.
    fn grant_of<T: 'static>(&self, fd: &Resource<T>) -> Option<usize> {
        self.held.get(&fd.rep()).and_then(|(g, _)| *g)
    }

    /// The report of the call so far.
    pub fn report(&self) -> FsReport {
        FsReport {
            bytes_written: self.meter.charged.load(Ordering::Relaxed),
            files_created: self.created_count,
            write_quota_exceeded: self.meter.exceeded.load(Ordering::Relaxed),
            preimages: self.preimages.clone(),
            ..self.report.clone()
        }
    }

    fn deny(&mut self, op: &str, path: &str, why: &str) -> FsError {
        if self.report.denied.len() < MAX_DENIALS_LISTED {
            self.report.denied.push(format!("{op} {path:?}: {why}"));
        } else {
            self.report.denied_dropped += 1;
        }
        ErrorCode::NotPermitted.into()
    }

    fn deny_read_only(&mut self, op: &str, path: &str) -> FsError {
        self.deny(op, path, "the tool is read-only")
    }

    /// Reserves one creation; `quota` when the call created as many objects as it may.
    fn reserve_creation(&mut self) -> FsResult<()> {
        if self.created_count >= self.policy.max_created {
            self.report.create_limit_exceeded = true;
            return Err(ErrorCode::Quota.into());
        }
        Ok(())
    }

    fn record_created(&mut self, id: Option<(u64, u64)>) {
        self.created_count += 1;
        if let Some(id) = id {
            self.created.insert(id);
        }
    }

    fn charge(&mut self, n: u64) -> FsResult<()> {
        if self.meter.charge(n) { Ok(()) } else { Err(ErrorCode::InsufficientSpace.into()) }
    }
}

/// `HasData` for [`GuardedFs`], to pass to the `wasi:filesystem` `add_to_linker` functions.
pub struct GuardedFsData;

impl HasData for GuardedFsData {
    type Data<'a> = GuardedFs<'a>;
}

/// Adds the guarded `wasi:filesystem` (`types` and `preopens`) to `linker`; `get` gives a
/// call's view: its WASI filesystem context and its [`FsGuard`].
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut wasmtime::component::Linker<T>,
    get: fn(&mut T) -> GuardedFs<'_>,
) -> wasmtime::Result<()> {
    use wasmtime_wasi::p2::bindings::filesystem;
    filesystem::types::add_to_linker::<T, GuardedFsData>(linker, get)?;
    filesystem::preopens::add_to_linker::<T, GuardedFsData>(linker, get)?;
    Ok(())
}

/// wasmtime-wasi's filesystem view and the call's guard.
pub struct GuardedFs<'a> {
    pub fs: WasiFilesystemCtxView<'a>,
    pub guard: &'a mut FsGuard,
}

fn borrow<T: 'static>(r: &Resource<T>) -> Resource<T> {
    Resource::new_borrow(r.rep())
}

fn id(h: types::MetadataHashValue) -> (u64, u64) {
    (h.lower, h.upper)
}

fn error_code(e: &FsError) -> Option<ErrorCode> {
    e.downcast_ref().copied()
}

impl GuardedFs<'_> {
    /// Identity of the object at `path` (not following a final symlink), if it exists.
    async fn identity_at(&mut self, dir: &Resource<Descriptor>, path: &str) -> Option<(u64, u64)> {
        HostDescriptor::metadata_hash_at(&mut self.fs, borrow(dir), PathFlags::empty(), path.into())
            .await
            .ok()
            .map(id)
    }

    async fn size_of(&mut self, fd: &Resource<Descriptor>) -> FsResult<u64> {
        Ok(HostDescriptor::stat(&mut self.fs, borrow(fd)).await?.size)
    }

    /// Refuses removing (or renaming away) the object at `path` unless this call created it
    /// or the tool is destructive.
    async fn check_removal(
        &mut self,
        op: &str,
        dir: &Resource<Descriptor>,
        path: &str,
    ) -> FsResult<()> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only(op, path));
        }
        if self.guard.policy.remove_existing {
            return Ok(());
        }
        match self.identity_at(dir, path).await {
            // Absent: let the operation fail with its own error.
            None => Ok(()),
            Some(id) if self.guard.created.contains(&id) => Ok(()),
            Some(_) => Err(self.guard.deny(
                op,
                path,
                "it existed before the call; only a destructive tool may remove or rename it",
            )),
        }
    }

    /// `open_at` once the checks before it passed: the creation cap, and whether this call
    /// created the file (recorded for the removal rule).
    async fn open_unchecked(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: PathFlags,
        path: String,
        oflags: OpenFlags,
        flags: DescriptorFlags,
    ) -> FsResult<Resource<Descriptor>> {
        if !oflags.contains(OpenFlags::CREATE) {
            return HostDescriptor::open_at(&mut self.fs, fd, path_flags, path, oflags, flags)
                .await;
        }
        // Creating: find out whether this call creates the file, atomically, by asking for
        // exclusive creation first.
        let exclusive = (oflags | OpenFlags::EXCLUSIVE) & !OpenFlags::TRUNCATE;
        if self.guard.created_count >= self.guard.policy.max_created {
            // No room for a new object: opening an existing one is still fine.
            if oflags.contains(OpenFlags::EXCLUSIVE) || self.identity_at(&fd, &path).await.is_none()
            {
                self.guard.reserve_creation()?;
            }
            let existing = oflags & !OpenFlags::CREATE;
            return HostDescriptor::open_at(&mut self.fs, fd, path_flags, path, existing, flags)
                .await;
        }
        match HostDescriptor::open_at(
            &mut self.fs,
            borrow(&fd),
            path_flags,
            path.clone(),
            exclusive,
            flags,
        )
        .await
        {
            Ok(new) => {
                let id = HostDescriptor::metadata_hash(&mut self.fs, borrow(&new)).await.ok();
                self.guard.record_created(id.map(self::id));
                Ok(new)
            }
            Err(e)
                if !oflags.contains(OpenFlags::EXCLUSIVE)
                    && error_code(&e) == Some(ErrorCode::Exist) =>
            {
                let existing = oflags & !OpenFlags::CREATE;
                HostDescriptor::open_at(&mut self.fs, fd, path_flags, path, existing, flags).await
            }
            Err(e) => Err(e),
        }
    }

    /// Wraps the output stream `res` so that what it writes is charged to the quota.
    fn meter_stream(
        &mut self,
        res: Resource<DynOutputStream>,
        pos: u64,
        size: u64,
        append: bool,
    ) -> FsResult<Resource<DynOutputStream>> {
        let inner = self.fs.table.delete(res)?;
        let metered: DynOutputStream =
            Box::new(MeteredStream { inner, meter: self.guard.meter.clone(), pos, size, append });
        Ok(self.fs.table.push(metered)?)
    }
}

impl preopens::Host for GuardedFs<'_> {
    fn get_directories(&mut self) -> wasmtime::Result<Vec<(Resource<Descriptor>, String)>> {
        let dirs = preopens::Host::get_directories(&mut self.fs)?;
        for (fd, guest) in &dirs {
            let grant = self.guard.grants.iter().position(|(g, _)| g == guest);
            self.guard.held.insert(fd.rep(), (grant, None));
        }
        Ok(dirs)
    }
}

impl types::Host for GuardedFs<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<ErrorCode> {
        types::Host::convert_error_code(&mut self.fs, err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        types::Host::filesystem_error_code(&mut self.fs, err)
    }
}

impl HostDescriptor for GuardedFs<'_> {
    async fn advise(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
        len: types::Filesize,
        advice: types::Advice,
    ) -> FsResult<()> {
        HostDescriptor::advise(&mut self.fs, fd, offset, len, advice).await
    }

    async fn sync_data(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        HostDescriptor::sync_data(&mut self.fs, fd).await
    }

    async fn get_flags(&mut self, fd: Resource<Descriptor>) -> FsResult<DescriptorFlags> {
        HostDescriptor::get_flags(&mut self.fs, fd).await
    }

    async fn get_type(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorType> {
        HostDescriptor::get_type(&mut self.fs, fd).await
    }

    async fn set_size(&mut self, fd: Resource<Descriptor>, size: types::Filesize) -> FsResult<()> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only("set-size", "(open file)"));
        }
        let old = self.size_of(&fd).await?;
        if size > old {
            self.guard.charge(size - old)?;
        }
        HostDescriptor::set_size(&mut self.fs, fd, size).await
    }

    async fn set_times(
        &mut self,
        fd: Resource<Descriptor>,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only("set-times", "(open file)"));
        }
        HostDescriptor::set_times(&mut self.fs, fd, atim, mtim).await
    }

    async fn read(
        &mut self,
        fd: Resource<Descriptor>,
        len: types::Filesize,
        offset: types::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        HostDescriptor::read(&mut self.fs, fd, len, offset).await
    }

    async fn write(
        &mut self,
        fd: Resource<Descriptor>,
        buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only("write", "(open file)"));
        }
        let size = self.size_of(&fd).await?;
        self.guard.charge((buf.len() as u64).saturating_add(offset.saturating_sub(size)))?;
        HostDescriptor::write(&mut self.fs, fd, buf, offset).await
    }

    async fn read_directory(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<types::DirectoryEntryStream>> {
        HostDescriptor::read_directory(&mut self.fs, fd).await
    }

    async fn sync(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        HostDescriptor::sync(&mut self.fs, fd).await
    }

    async fn create_directory_at(
        &mut self,
        fd: Resource<Descriptor>,
        path: String,
    ) -> FsResult<()> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only("create-directory", &path));
        }
        self.check_path("create-directory", &fd, &path, false, None).await?;
        self.guard.reserve_creation()?;
        HostDescriptor::create_directory_at(&mut self.fs, borrow(&fd), path.clone()).await?;
        let id = self.identity_at(&fd, &path).await;
        self.guard.record_created(id);
        Ok(())
    }

    async fn stat(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorStat> {
        HostDescriptor::stat(&mut self.fs, fd).await
    }

    async fn stat_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: PathFlags,
        path: String,
    ) -> FsResult<types::DescriptorStat> {
        let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
        self.check_path("stat", &fd, &path, follow, None).await?;
        HostDescriptor::stat_at(&mut self.fs, fd, path_flags, path).await
    }

    async fn set_times_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: PathFlags,
        path: String,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only("set-times", &path));
        }
        let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
        self.check_path("set-times", &fd, &path, follow, None).await?;
        HostDescriptor::set_times_at(&mut self.fs, fd, path_flags, path, atim, mtim).await
    }

    async fn link_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path_flags: PathFlags,
        old_path: String,
        new_descriptor: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only("link", &new_path));
        }
        // A link from one grant into another would let a later call granted only the second
        // change the file in the first.
        let (from, to) = (self.guard.grant_of(&fd), self.guard.grant_of(&new_descriptor));
        if from != to || from.is_none() {
            return Err(self.guard.deny(
                "link",
                &new_path,
                "a hard link may not join two grants (a call granted one could then change the file in the other)",
            ));
        }
        let follow = old_path_flags.contains(PathFlags::SYMLINK_FOLLOW);
        self.check_path("link", &fd, &old_path, follow, Some(false)).await?;
        self.check_path("link", &new_descriptor, &new_path, false, None).await?;
        self.guard.reserve_creation()?;
        HostDescriptor::link_at(
            &mut self.fs,
            fd,
            old_path_flags,
            old_path,
            new_descriptor,
            new_path,
        )
        .await?;
        // A new name for an object that may have existed before: it is not recorded as
        // created, so removing it later needs a destructive tool.
        self.guard.record_created(None);
        Ok(())
    }

    async fn open_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: PathFlags,
        path: String,
        oflags: OpenFlags,
        flags: DescriptorFlags,
    ) -> FsResult<Resource<Descriptor>> {
        let changes = oflags.intersects(OpenFlags::CREATE | OpenFlags::TRUNCATE)
            || flags.intersects(DescriptorFlags::WRITE | DescriptorFlags::MUTATE_DIRECTORY);
        if self.guard.policy.read_only && changes {
            return Err(self.guard.deny_read_only("open for writing", &path));
        }
        let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
        let write = flags.contains(DescriptorFlags::WRITE) || oflags.contains(OpenFlags::TRUNCATE);
        self.check_path("open", &fd, &path, follow, Some(write)).await?;
        if write {
            self.take_preimage(&fd, &path, follow).await?;
        }
        // One of the process's descriptors for tools, held while the guest keeps it open.
        let permit = match self.guard.descriptors.try_take(1) {
            Ok(p) => p,
            Err(e) => {
                self.guard.deny("open", &path, &e.to_string());
                return Err(ErrorCode::Busy.into());
            }
        };
        let grant = self.guard.grant_of(&fd);
        let opened = self.open_unchecked(fd, path_flags, path.clone(), oflags, flags).await?;
        let opened = self.check_opened(&path, opened)?;
        self.guard.held.insert(opened.rep(), (grant, Some(permit)));
        Ok(opened)
    }

    fn drop(&mut self, fd: Resource<Descriptor>) -> wasmtime::Result<()> {
        self.guard.held.remove(&fd.rep());
        HostDescriptor::drop(&mut self.fs, fd)
    }

    async fn readlink_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<String> {
        self.check_path("readlink", &fd, &path, false, None).await?;
        HostDescriptor::readlink_at(&mut self.fs, fd, path).await
    }

    async fn remove_directory_at(
        &mut self,
        fd: Resource<Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.check_path("remove-directory", &fd, &path, false, None).await?;
        self.check_removal("remove-directory", &fd, &path).await?;
        HostDescriptor::remove_directory_at(&mut self.fs, fd, path).await
    }

    async fn rename_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path: String,
        new_fd: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.check_path("rename", &fd, &old_path, false, None).await?;
        self.check_path("rename", &new_fd, &new_path, false, None).await?;
        self.check_removal("rename", &fd, &old_path).await?;
        if !self.guard.policy.remove_existing
            && let Some(target) = self.identity_at(&new_fd, &new_path).await
            && !self.guard.created.contains(&target)
        {
            // Renaming onto an existing file rewrites it; onto an existing directory removes it.
            let stat = HostDescriptor::stat_at(
                &mut self.fs,
                borrow(&new_fd),
                PathFlags::empty(),
                new_path.clone(),
            )
            .await?;
            if stat.type_ == types::DescriptorType::Directory {
                return Err(self.guard.deny(
                    "rename onto",
                    &new_path,
                    "the directory existed before the call; only a destructive tool may \
                     replace it",
                ));
            }
        }
        // Both names change: the object renamed away, and the one it replaces.
        self.take_preimage(&fd, &old_path, false).await?;
        self.take_preimage(&new_fd, &new_path, false).await?;
        HostDescriptor::rename_at(&mut self.fs, fd, old_path, new_fd, new_path).await
    }

    async fn symlink_at(
        &mut self,
        fd: Resource<Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only("symlink", &dest_path));
        }
        self.check_path("symlink", &fd, &dest_path, false, None).await?;
        self.guard.reserve_creation()?;
        HostDescriptor::symlink_at(&mut self.fs, borrow(&fd), src_path, dest_path.clone()).await?;
        let id = self.identity_at(&fd, &dest_path).await;
        self.guard.record_created(id);
        Ok(())
    }

    async fn unlink_file_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        self.check_path("unlink", &fd, &path, false, None).await?;
        self.check_removal("unlink", &fd, &path).await?;
        self.take_preimage(&fd, &path, false).await?;
        HostDescriptor::unlink_file_at(&mut self.fs, fd, path).await
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<wasmtime_wasi::p2::DynInputStream>> {
        HostDescriptor::read_via_stream(&mut self.fs, fd, offset)
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only("write", "(open file)"));
        }
        let size = file_size(&mut self.fs, &fd)?;
        let res = HostDescriptor::write_via_stream(&mut self.fs, fd, offset)?;
        self.meter_stream(res, offset, size, false)
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<Resource<DynOutputStream>> {
        if self.guard.policy.read_only {
            return Err(self.guard.deny_read_only("append", "(open file)"));
        }
        let size = file_size(&mut self.fs, &fd)?;
        let res = HostDescriptor::append_via_stream(&mut self.fs, fd)?;
        self.meter_stream(res, size, size, true)
    }

    async fn is_same_object(
        &mut self,
        a: Resource<Descriptor>,
        b: Resource<Descriptor>,
    ) -> wasmtime::Result<bool> {
        HostDescriptor::is_same_object(&mut self.fs, a, b).await
    }

    async fn metadata_hash(
        &mut self,
        fd: Resource<Descriptor>,
    ) -> FsResult<types::MetadataHashValue> {
        HostDescriptor::metadata_hash(&mut self.fs, fd).await
    }

    async fn metadata_hash_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: PathFlags,
        path: String,
    ) -> FsResult<types::MetadataHashValue> {
        let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
        self.check_path("stat", &fd, &path, follow, None).await?;
        HostDescriptor::metadata_hash_at(&mut self.fs, fd, path_flags, path).await
    }
}

impl HostDirectoryEntryStream for GuardedFs<'_> {
    async fn read_directory_entry(
        &mut self,
        stream: Resource<types::DirectoryEntryStream>,
    ) -> FsResult<Option<types::DirectoryEntry>> {
        HostDirectoryEntryStream::read_directory_entry(&mut self.fs, stream).await
    }

    fn drop(&mut self, stream: Resource<types::DirectoryEntryStream>) -> wasmtime::Result<()> {
        HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}

/// Size of the open file `fd`, read without leaving the calling thread (the stream functions
/// are synchronous). Not a file: 0, and the inner call reports the error.
fn file_size(fs: &mut WasiFilesystemCtxView<'_>, fd: &Resource<Descriptor>) -> FsResult<u64> {
    match fs.table.get(fd)? {
        Descriptor::File(f) => Ok(f.file.metadata().map(|m| m.len()).unwrap_or(0)),
        Descriptor::Dir(_) => Ok(0),
    }
}
