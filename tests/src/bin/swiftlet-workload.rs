//! Workload generator for tests and benchmarks.
//!
//! `swiftlet-workload steps` reads commands from stdin, one per line, and
//! answers `ok` (or `err <why>`) after each:
//!   anon <MiB>        allocate and touch anonymous memory (kept)
//!   free-anon         release all anonymous memory
//!   cache <MiB> <dir> write a file of that size (page cache, kept)
//!   uncache           delete the files written by `cache`
//!   fork <N>          start N child processes that wait
//!   reap              end the children and wait for them
//!   files <M> <dir>   create M empty files
//!   unlink            delete the files created by `files`
//!   exit
//! `swiftlet-workload hog <MiB/s> <max MiB>` touches memory at a steady rate.
//! `swiftlet-workload sleep` waits until killed.
//! `swiftlet-workload balloon <MiB>` locks that much memory (mlock), makes
//! itself the OOM killer's last choice, prints `ready` and waits.
//! `swiftlet-workload touch <MiB>` touches that much memory in 4 KiB pages, then exits.
//! `swiftlet-workload forkloop <N>` forks N children that exit at once, one at a time.
//! `swiftlet-workload fileloop <N> <dir>` creates and unlinks N files.
//! `swiftlet-workload reread <dir>` reads every file in the directory with
//! read(2), over and over until killed: hot page cache, charged to its cgroup.

use std::{
    fs,
    io::{BufRead, Write},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

struct Anon {
    ptr: *mut u8,
    len: usize,
}

fn map_and_touch(len: usize) -> Result<Anon, String> {
    // SAFETY: anonymous private mapping of `len` bytes.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let ptr = ptr.cast::<u8>();
    for off in (0..len).step_by(PAGE) {
        // SAFETY: within the mapping.
        unsafe { ptr.add(off).write_volatile(1) };
    }
    Ok(Anon { ptr, len })
}

fn unmap(a: Anon) {
    // SAFETY: unmapping a mapping made by map_and_touch.
    unsafe { libc::munmap(a.ptr.cast(), a.len) };
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("steps") => steps(),
        Some("hog") => {
            // A BestEffort container's score: first in line for the OOM killer.
            let _ = fs::write("/proc/self/oom_score_adj", "1000");
            let rate: f64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256.0);
            let max: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1024);
            hog(rate, max);
        }
        Some("balloon") => {
            let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1024);
            // Never the OOM killer's choice: the balloon stands for memory
            // the rest of a node would use.
            let _ = fs::write("/proc/self/oom_score_adj", "-1000");
            match map_and_touch(mib * MIB) {
                Ok(a) => {
                    // SAFETY: locking the mapping we just made.
                    if unsafe { libc::mlock(a.ptr.cast(), a.len) } != 0 {
                        eprintln!("balloon: mlock failed: {}", std::io::Error::last_os_error());
                        std::process::exit(1);
                    }
                    println!("ready");
                    let _ = std::io::stdout().flush();
                    loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    }
                }
                Err(e) => {
                    eprintln!("balloon: {e}");
                    std::process::exit(1);
                }
            }
        }
        Some("touch") => {
            let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
            match map_and_touch(mib * MIB) {
                Ok(a) => unmap(a),
                Err(e) => {
                    eprintln!("touch: {e}");
                    std::process::exit(1);
                }
            }
        }
        Some("forkloop") => {
            let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
            for _ in 0..n {
                // SAFETY: the child only calls _exit.
                match unsafe { libc::fork() } {
                    // SAFETY: in the child, _exit is async-signal-safe and
                    // touches nothing the parent's threads hold.
                    0 => unsafe { libc::_exit(0) },
                    pid if pid > 0 => {
                        let mut status = 0;
                        // SAFETY: waiting for our own child.
                        unsafe { libc::waitpid(pid, &mut status, 0) };
                    }
                    _ => {
                        eprintln!("forkloop: fork failed: {}", std::io::Error::last_os_error());
                        std::process::exit(1);
                    }
                }
            }
        }
        Some("forkstorm") => {
            // A tree of processes that all fork at once: this one forks
            // `width` children, each of which forks `width` more, and so on
            // `depth` levels down; every process then sleeps. A kill that
            // reads the cgroup's tasks while this runs races many forks.
            let width: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(30);
            let depth: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2);
            let mut level = 0;
            let mut i = 0;
            while level < depth && i < width {
                // SAFETY: the child goes on with plain code (no locks held:
                // this process is single-threaded).
                match unsafe { libc::fork() } {
                    0 => {
                        level += 1;
                        i = 0;
                    }
                    _ => i += 1,
                }
            }
            loop {
                // SAFETY: no preconditions.
                unsafe { libc::pause() };
            }
        }
        Some("threads") => {
            // One process holding `n` threads that sleep: a thread bomb.
            let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
            let mut started = 0;
            for _ in 0..n {
                let spawned = std::thread::Builder::new().stack_size(64 * 1024).spawn(|| {
                    loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    }
                });
                if spawned.is_err() {
                    break;
                }
                started += 1;
            }
            println!("threads {started}");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Some("fileloop") => {
            let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
            let dir = PathBuf::from(args.get(2).map(String::as_str).unwrap_or("."));
            for i in 0..n {
                let p = dir.join(format!("loop-{}-{i}", std::process::id()));
                if let Err(e) = fs::File::create(&p).and_then(|_| fs::remove_file(&p)) {
                    eprintln!("fileloop: {}: {e}", p.display());
                    std::process::exit(1);
                }
            }
        }
        Some("reread") => {
            let dir = PathBuf::from(args.get(1).map(String::as_str).unwrap_or("."));
            if let Err(e) = reread(&dir) {
                eprintln!("reread: {}: {e}", dir.display());
                std::process::exit(1);
            }
        }
        Some("sleep") => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        Some("child-wait") => {
            // Blocks until the parent closes our stdin.
            let mut s = String::new();
            let _ = std::io::stdin().read_line(&mut s);
        }
        _ => {
            eprintln!("usage: swiftlet-workload steps | hog <MiB/s> <max MiB> | sleep");
            std::process::exit(2);
        }
    }
}

/// Reads every regular file in `dir` in turn, forever. A page read twice
/// moves to the active list, so from the second pass on the whole set is
/// active page cache (what the working set counts).
fn reread(dir: &std::path::Path) -> std::io::Result<()> {
    let mut files: Vec<PathBuf> =
        fs::read_dir(dir)?.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_file())).map(|e| e.path()).collect();
    files.sort();
    if files.is_empty() {
        return Err(std::io::Error::other("no files to read"));
    }
    let mut buf = vec![0u8; MIB];
    loop {
        for f in &files {
            let mut file = fs::File::open(f)?;
            while std::io::Read::read(&mut file, &mut buf)? > 0 {}
        }
    }
}

/// Touches memory in 1 MiB chunks at `rate` MiB/s up to `max` MiB, printing
/// progress, then waits.
fn hog(rate: f64, max: usize) {
    let start = Instant::now();
    let mut held = Vec::new();
    for i in 0..max {
        let due = Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        match map_and_touch(MIB) {
            Ok(a) => held.push(a),
            Err(e) => {
                eprintln!("hog: allocation failed at {i} MiB: {e}");
                break;
            }
        }
    }
    println!("hog: holding {} MiB", held.len());
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn steps() {
    let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("swiftlet-workload"));
    let mut anon: Vec<Anon> = vec![];
    let mut cached: Vec<PathBuf> = vec![];
    let mut created: Vec<PathBuf> = vec![];
    let mut children: Vec<Child> = vec![];
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let result: Result<(), String> = match words.as_slice() {
            ["anon", mib] => mib
                .parse::<usize>()
                .map_err(|e| e.to_string())
                .and_then(|m| map_and_touch(m * MIB))
                .map(|a| anon.push(a)),
            ["free-anon"] => {
                anon.drain(..).for_each(unmap);
                Ok(())
            }
            ["cache", mib, dir] => mib.parse::<usize>().map_err(|e| e.to_string()).and_then(|m| {
                let path = PathBuf::from(dir).join(format!("cache-{}-{}", std::process::id(), cached.len()));
                let chunk = vec![7u8; MIB];
                let mut f = fs::File::create(&path).map_err(|e| e.to_string())?;
                for _ in 0..m {
                    f.write_all(&chunk).map_err(|e| e.to_string())?;
                }
                cached.push(path);
                Ok(())
            }),
            ["uncache"] => {
                for p in cached.drain(..) {
                    let _ = fs::remove_file(p);
                }
                Ok(())
            }
            ["fork", n] => n.parse::<usize>().map_err(|e| e.to_string()).and_then(|n| {
                for _ in 0..n {
                    let c =
                        Command::new(&me).arg("child-wait").stdin(Stdio::piped()).spawn().map_err(|e| e.to_string())?;
                    children.push(c);
                }
                Ok(())
            }),
            ["reap"] => {
                for mut c in children.drain(..) {
                    drop(c.stdin.take());
                    let _ = c.wait();
                }
                Ok(())
            }
            ["files", m, dir] => m.parse::<usize>().map_err(|e| e.to_string()).and_then(|m| {
                for i in 0..m {
                    let p = PathBuf::from(dir).join(format!("f-{}-{}", std::process::id(), created.len() + i));
                    fs::File::create(&p).map_err(|e| e.to_string())?;
                }
                let base = created.len();
                created
                    .extend((0..m).map(|i| PathBuf::from(dir).join(format!("f-{}-{}", std::process::id(), base + i))));
                Ok(())
            }),
            ["unlink"] => {
                for p in created.drain(..) {
                    let _ = fs::remove_file(p);
                }
                Ok(())
            }
            ["exit"] => break,
            _ => Err(format!("unknown command `{line}`")),
        };
        let reply = match result {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("err {e}"),
        };
        if writeln!(out, "{reply}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
    for mut c in children {
        drop(c.stdin.take());
        let _ = c.wait();
    }
}
