//! The store's log (SQLite's write-ahead log) written a commit at a time.
//!
//! SQLite writes each frame of a commit as two `pwrite`s, the frame's
//! 24-byte header and then its page: a read-only call's two commits made 35
//! of them, 11.5% of serve's CPU, most of it the kernel's work per write
//! rather than the bytes. This VFS is the platform's own with the log's
//! file wrapped: it gathers a commit's contiguous writes and makes them one
//! write once the commit's last frame is whole. SQLite publishes a commit
//! in the log's index (shared memory) only after that, so no reader, in
//! this process or another, can be shown a frame that is not in the file.
//!
//! A frame as two writes, header then page, is how SQLite 3.51 (the bundled
//! one) writes it; the tests read every commit from another connection
//! the moment it returns, which fails should a later SQLite write a frame
//! otherwise.
//!
//! Anything else done to the log (a read, a sync, a truncation, its size, a
//! write elsewhere in it, closing it) writes what is gathered first, so each
//! operation finds the file as direct writes would have left it. A process
//! that dies with writes gathered has died before its commit was published,
//! which SQLite's recovery already reads as a commit that never happened.
//! Every other file (the database, its shared memory, journals) is the
//! platform VFS's own, unwrapped.
//!
//! The module is unsafe because a VFS is C's interface: SQLite calls these
//! functions with pointers into memory it allocated, `szOsFile` bytes a
//! file, of which the first are a [`LogFile`] and the rest the platform's
//! file.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int, c_void};
use std::ptr;
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name connections open the store's file with.
pub(super) const NAME: &CStr = c"toolgate";

/// The most the platform's file writes at once: it is written for SQLite's
/// own writes, a page at most (64 KiB), and takes no more than 128 KiB.
const WRITE_BOUND: usize = 1 << 16;

/// Gathered bytes past which they are written whatever follows: a commit of
/// many pages (a migration) does not hold them all.
const GATHERED_BOUND: usize = 1 << 20;

/// A frame header's size; its bytes 4 to 8 are, on a commit's last frame,
/// the database's size in pages after the commit, and zero on every other.
const FRAME_HEADER: usize = 24;

/// The platform's VFS, whose files the log's wrap, once this VFS is
/// registered beside it; or SQLite's code for why it is not.
static PLATFORM: OnceLock<Result<usize, c_int>> = OnceLock::new();

/// Registers the VFS once; SQLite's result code, `SQLITE_OK` when it is
/// (or already was) registered.
pub(super) fn register() -> c_int {
    let registered = PLATFORM.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find initialises SQLite and returns the
        // default VFS (the platform's) or NULL; the copy is leaked, so the
        // registered VFS lives as long as the process, as SQLite requires.
        // No connection opens through it before this returns: each asks
        // register first, which waits for this.
        unsafe {
            let platform = ffi::sqlite3_vfs_find(ptr::null());
            if platform.is_null() {
                return Err(ffi::SQLITE_ERROR);
            }
            let mut vfs = *platform;
            vfs.zName = NAME.as_ptr();
            vfs.pNext = ptr::null_mut();
            vfs.szOsFile = (*platform).szOsFile + size_of::<LogFile>() as c_int;
            vfs.xOpen = Some(open);
            match ffi::sqlite3_vfs_register(Box::leak(Box::new(vfs)), 0) {
                ffi::SQLITE_OK => Ok(platform as usize),
                code => Err(code),
            }
        }
    });
    match registered {
        Ok(_) => ffi::SQLITE_OK,
        Err(code) => *code,
    }
}

/// A log file: SQLite's handle, then the platform's file after it.
#[repr(C)]
struct LogFile {
    /// Points at [`LOG_METHODS`].
    base: ffi::sqlite3_file,
    gathered: *mut Gathered,
}

/// Writes not yet made, contiguous from `offset`.
#[derive(Default)]
struct Gathered {
    bytes: Vec<u8>,
    offset: i64,
    /// The last frame header written was a commit's last frame's (or, with
    /// sectors padded, of a copy of it after it). Until the next header,
    /// each write is made at once: its page ends the commit, and SQLite
    /// may write that page in two parts around a sync.
    in_commit_frame: bool,
    /// The log was read since the last write. SQLite reads the log while
    /// writing it only to rewrite the checksums of frames the same commit
    /// wrote, one header at a time with no page after it; the last of
    /// those ends the commit, so a commit's header after a read is made at
    /// once.
    read: bool,
}

static LOG_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
};

/// The platform's file inside `file`'s memory, after the [`LogFile`].
///
/// # Safety
/// `file` is `szOsFile` bytes SQLite allocated for this VFS.
unsafe fn platform_file(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY: the allocation is size_of::<LogFile>() bytes longer than the
    // platform's file, and SQLite aligns it for any type (8 bytes), which
    // LogFile's size (two pointers) keeps.
    unsafe { file.cast::<u8>().add(size_of::<LogFile>()).cast() }
}

/// The platform file's methods, or `None` once it has none.
///
/// # Safety
/// `file` is an opened [`LogFile`].
unsafe fn methods(file: *mut ffi::sqlite3_file) -> Option<&'static ffi::sqlite3_io_methods> {
    // SAFETY: the platform's xOpen set pMethods to its static table.
    unsafe { (*platform_file(file)).pMethods.as_ref() }
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let Some(&Ok(platform)) = PLATFORM.get() else {
        return ffi::SQLITE_MISUSE;
    };
    let platform = platform as *mut ffi::sqlite3_vfs;
    // SAFETY: platform is the VFS registered beside this one, and file is
    // this VFS's szOsFile bytes, more than the platform's.
    unsafe {
        let Some(platform_open) = (*platform).xOpen else {
            return ffi::SQLITE_MISUSE;
        };
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            return platform_open(platform, name, file, flags, out_flags);
        }
        let inner = platform_file(file);
        let opened = platform_open(platform, name, inner, flags, out_flags);
        let log = file.cast::<LogFile>();
        if opened != ffi::SQLITE_OK {
            // SQLite closes a file whose open failed only when it has
            // methods: this one has none, so the platform's is closed here.
            if let Some(close) = (*inner)
                .pMethods
                .as_ref()
                .and_then(|methods| methods.xClose)
            {
                close(inner);
            }
            (*log).base.pMethods = ptr::null();
            return opened;
        }
        ptr::write(
            log,
            LogFile {
                base: ffi::sqlite3_file {
                    pMethods: &LOG_METHODS,
                },
                gathered: Box::into_raw(Box::default()),
            },
        );
        ffi::SQLITE_OK
    }
}

/// Writes what `file` has gathered, if anything: SQLite's result code.
///
/// # Safety
/// `file` is an opened [`LogFile`].
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: an opened LogFile's gathered is its own Box, used by one
    // connection at a time (SQLite's), and its platform file is open.
    unsafe {
        let gathered = &mut *(*file.cast::<LogFile>()).gathered;
        if gathered.bytes.is_empty() {
            return ffi::SQLITE_OK;
        }
        let Some(write) = methods(file).and_then(|methods| methods.xWrite) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let mut written = ffi::SQLITE_OK;
        let mut offset = gathered.offset;
        for chunk in gathered.bytes.chunks(WRITE_BOUND) {
            // A chunk is at most WRITE_BOUND bytes, which an int holds.
            written = write(
                platform_file(file),
                chunk.as_ptr().cast(),
                chunk.len() as c_int,
                offset,
            );
            if written != ffi::SQLITE_OK {
                break;
            }
            offset += chunk.len() as i64;
        }
        // Written or failed, they are not written again: a failed commit
        // is SQLite's to roll back.
        gathered.bytes.clear();
        written
    }
}

unsafe extern "C" fn write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    let Ok(length) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    if length == 0 {
        return ffi::SQLITE_OK;
    }
    // SAFETY: SQLite passes `amount` readable bytes at `data`; file is an
    // opened LogFile.
    unsafe {
        let gathered = &mut *(*file.cast::<LogFile>()).gathered;
        let end = gathered.offset + gathered.bytes.len() as i64;
        if !gathered.bytes.is_empty() && offset != end {
            let flushed = flush(file);
            if flushed != ffi::SQLITE_OK {
                return flushed;
            }
        }
        let gathered = &mut *(*file.cast::<LogFile>()).gathered;
        let bytes = std::slice::from_raw_parts(data.cast::<u8>(), length);
        if gathered.bytes.is_empty() {
            gathered.offset = offset;
        }
        gathered.bytes.extend_from_slice(bytes);
        let header = length == FRAME_HEADER;
        let read = std::mem::take(&mut gathered.read);
        if header {
            gathered.in_commit_frame = bytes[4..8].iter().any(|&byte| byte != 0);
        }
        let ends_commit = gathered.in_commit_frame && (read || !header);
        if ends_commit || gathered.bytes.len() >= GATHERED_BOUND {
            return flush(file);
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn read(
    file: *mut ffi::sqlite3_file,
    data: *mut c_void,
    amount: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: file is an opened LogFile; the rest is passed on as it came.
    unsafe {
        (*(*file.cast::<LogFile>()).gathered).read = true;
        read_gathered(file, data, amount, offset)
    }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: file is an opened LogFile, closed once; its gathered Box is
    // dropped here and never used again.
    unsafe {
        let flushed = flush(file);
        let closed = match methods(file).and_then(|methods| methods.xClose) {
            Some(close) => close(platform_file(file)),
            None => ffi::SQLITE_OK,
        };
        let log = file.cast::<LogFile>();
        drop(Box::from_raw((*log).gathered));
        (*log).gathered = ptr::null_mut();
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            closed
        }
    }
}

/// Defines a method that writes what is gathered, then hands the call to
/// the platform's file.
macro_rules! flushed_then {
    ($name:ident, $method:ident, ($($argument:ident: $type:ty),*)) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $argument: $type)*) -> c_int {
            // SAFETY: file is an opened LogFile; the arguments are SQLite's,
            // passed on as they came.
            unsafe {
                let flushed = flush(file);
                if flushed != ffi::SQLITE_OK {
                    return flushed;
                }
                match methods(file).and_then(|methods| methods.$method) {
                    Some(method) => method(platform_file(file) $(, $argument)*),
                    None => ffi::SQLITE_IOERR,
                }
            }
        }
    };
}

/// Defines a method handed to the platform's file as it is.
macro_rules! passed_on {
    ($name:ident, $method:ident, ($($argument:ident: $type:ty),*), $missing:expr) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $argument: $type)*) -> c_int {
            // SAFETY: file is an opened LogFile; the arguments are SQLite's,
            // passed on as they came.
            unsafe {
                match methods(file).and_then(|methods| methods.$method) {
                    Some(method) => method(platform_file(file) $(, $argument)*),
                    None => $missing,
                }
            }
        }
    };
}

flushed_then!(read_gathered, xRead, (data: *mut c_void, amount: c_int, offset: i64));
flushed_then!(truncate, xTruncate, (size: i64));
flushed_then!(sync, xSync, (flags: c_int));
flushed_then!(file_size, xFileSize, (size: *mut i64));
flushed_then!(lock, xLock, (level: c_int));
flushed_then!(unlock, xUnlock, (level: c_int));
flushed_then!(check_reserved_lock, xCheckReservedLock, (reserved: *mut c_int));
flushed_then!(file_control, xFileControl, (operation: c_int, argument: *mut c_void));
flushed_then!(fetch, xFetch, (offset: i64, amount: c_int, mapped: *mut *mut c_void));
flushed_then!(unfetch, xUnfetch, (offset: i64, mapped: *mut c_void));
passed_on!(sector_size, xSectorSize, (), 4096);
passed_on!(device_characteristics, xDeviceCharacteristics, (), 0);
passed_on!(shm_map, xShmMap, (page: c_int, size: c_int, extend: c_int, mapped: *mut *mut c_void), ffi::SQLITE_IOERR);
passed_on!(shm_lock, xShmLock, (offset: c_int, count: c_int, flags: c_int), ffi::SQLITE_IOERR);
passed_on!(shm_unmap, xShmUnmap, (delete: c_int), ffi::SQLITE_OK);

unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: file is an opened LogFile.
    unsafe {
        if let Some(barrier) = methods(file).and_then(|methods| methods.xShmBarrier) {
            barrier(platform_file(file));
        }
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::super::{Role, open};

    /// Write system calls this thread has made (read, write, pwrite and
    /// their vectored kinds count alike as the kernel counts them).
    fn writes_made() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        io.lines()
            .find_map(|line| line.strip_prefix("syscw: "))
            .unwrap()
            .parse()
            .unwrap()
    }

    /// A new store file and a relaxed connection to it holding `table`.
    fn relaxed_with(table: &str) -> (tempfile::TempDir, std::path::PathBuf, Connection) {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("toolgate.db");
        let connection = open(&path, Role::Relaxed).unwrap();
        connection.execute_batch(table).unwrap();
        (folder, path, connection)
    }

    /// A commit of twelve pages reaches the log in one write: SQLite's own
    /// would be two a page. The reads a commit makes are none here (every
    /// page is new), so the count is the log's writes and nothing else's.
    #[test]
    fn a_commit_of_many_pages_is_one_write_to_the_log() {
        let (_folder, _path, connection) = relaxed_with("CREATE TABLE pages (body BLOB)");
        for _ in 0..3 {
            connection.execute_batch("BEGIN IMMEDIATE").unwrap();
            for _ in 0..12 {
                connection
                    .execute("INSERT INTO pages (body) VALUES (zeroblob(3000))", [])
                    .unwrap();
            }
            let before = writes_made();
            connection.execute_batch("COMMIT").unwrap();
            assert_eq!(
                writes_made() - before,
                1,
                "a commit's frames were written apart"
            );
        }
    }

    /// What a commit wrote is in the file when the commit returns: another
    /// connection, on the platform's own VFS with its own handle on the
    /// log, reads every row at once, and the file is whole after.
    #[test]
    fn another_connection_reads_a_commit_as_soon_as_it_returns() {
        let (_folder, path, writer) = relaxed_with("CREATE TABLE pages (n INTEGER, body BLOB)");
        let reader = Connection::open(&path).unwrap();
        for round in 1..=50_i64 {
            writer.execute_batch("BEGIN IMMEDIATE").unwrap();
            for _ in 0..round % 7 + 1 {
                writer
                    .execute(
                        "INSERT INTO pages (n, body) VALUES (?1, randomblob(1500))",
                        [round],
                    )
                    .unwrap();
            }
            writer.execute_batch("COMMIT").unwrap();
            let seen: i64 = reader
                .query_row("SELECT count(*) FROM pages WHERE n = ?1", [round], |row| {
                    row.get(0)
                })
                .unwrap();
            assert_eq!(
                seen,
                round % 7 + 1,
                "round {round}'s rows were not all read"
            );
        }
        drop(reader);
        drop(writer);
        let reopened = open(&path, Role::Other).unwrap();
        let check: String = reopened
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        let rows: i64 = reopened
            .query_row("SELECT count(*) FROM pages", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, (1..=50).map(|round| round % 7 + 1).sum::<i64>());
    }

    /// What a process that died the moment a commit returned leaves (the
    /// database and its log as they are, no shared memory) holds that
    /// commit, read by SQLite's recovery from the log's own checksums. The
    /// commits spill pages to the log before they end and write some of
    /// them again, so SQLite rewrites their checksums, header by header,
    /// as its commit's last writes.
    #[test]
    fn a_commit_is_whole_in_the_log_when_it_returns_even_with_its_checksums_rewritten() {
        let (folder, path, writer) =
            relaxed_with("PRAGMA cache_size = 10; CREATE TABLE pages (n INTEGER, body BLOB)");
        for round in 1..=4_i64 {
            writer.execute_batch("BEGIN IMMEDIATE").unwrap();
            for _ in 0..60 {
                writer
                    .execute(
                        "INSERT INTO pages (n, body) VALUES (?1, randomblob(1500))",
                        [round],
                    )
                    .unwrap();
            }
            // Pages already spilled to the log in this commit, written again.
            writer
                .execute(
                    "UPDATE pages SET body = randomblob(1400) WHERE n = ?1",
                    [round],
                )
                .unwrap();
            writer.execute_batch("COMMIT").unwrap();
            let left = folder.path().join(format!("left-{round}"));
            std::fs::create_dir(&left).unwrap();
            std::fs::copy(&path, left.join("toolgate.db")).unwrap();
            std::fs::copy(
                folder.path().join("toolgate.db-wal"),
                left.join("toolgate.db-wal"),
            )
            .unwrap();
            let recovered = Connection::open(left.join("toolgate.db")).unwrap();
            let rows: i64 = recovered
                .query_row("SELECT count(*) FROM pages", [], |row| row.get(0))
                .unwrap();
            assert_eq!(rows, 60 * round, "commit {round} was not whole in the log");
            let check: String = recovered
                .query_row("PRAGMA integrity_check", [], |row| row.get(0))
                .unwrap();
            assert_eq!(check, "ok");
        }
    }

    /// Where sectors are padded (a file without powersafe overwrite), SQLite
    /// ends a synchronous commit with copies of its last frame up to the
    /// next sector, and writes the last copy's page in two parts around the
    /// sync: the part after it is the page a reader is sent to. Another
    /// connection reads each commit's page as the commit wrote it.
    #[test]
    fn a_padded_commit_is_read_whole_by_another_connection() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("toolgate.db");
        assert_eq!(super::register(), rusqlite::ffi::SQLITE_OK);
        let writer = Connection::open_with_flags_and_vfs(
            format!("file:{}?psow=0", path.display()),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                | rusqlite::OpenFlags::SQLITE_OPEN_CREATE
                | rusqlite::OpenFlags::SQLITE_OPEN_URI,
            super::NAME,
        )
        .unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
                 CREATE TABLE pages (n INTEGER PRIMARY KEY, body BLOB); \
                 INSERT INTO pages (n, body) VALUES (1, zeroblob(3000))",
            )
            .unwrap();
        let reader = Connection::open(&path).unwrap();
        let before = std::fs::metadata(folder.path().join("toolgate.db-wal"))
            .unwrap()
            .len();
        for _ in 0..40 {
            let written: String = writer
                .query_row(
                    "UPDATE pages SET body = randomblob(3000) WHERE n = 1 RETURNING hex(body)",
                    [],
                    |row| row.get(0),
                )
                .unwrap();
            let read: String = reader
                .query_row("SELECT hex(body) FROM pages WHERE n = 1", [], |row| {
                    row.get(0)
                })
                .unwrap();
            assert_eq!(
                read, written,
                "the reader was sent a page the commit had not written"
            );
        }
        // Padded: each commit wrote more than its one page.
        let grown = std::fs::metadata(folder.path().join("toolgate.db-wal"))
            .unwrap()
            .len()
            - before;
        assert!(
            grown > 40 * 4120,
            "the commits were not padded ({grown} bytes)"
        );
    }
}
