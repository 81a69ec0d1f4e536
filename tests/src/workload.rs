//! Starting the workload generator inside a test cgroup and driving it.

use std::{
    ffi::CString,
    io::{BufRead, BufReader, Write},
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use swiftlet::cgroups::{CgroupFs, Version};

/// A binary of this workspace built beside the running one: next to it
/// (benchmark runner in target/<profile>/) or one level up (test binaries
/// in target/<profile>/deps/).
pub fn sibling_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("own executable path");
    let dir = exe.parent().expect("executable directory");
    let candidates = [dir.join(name), dir.parent().map(|d| d.join(name)).unwrap_or_default()];
    match candidates.iter().find(|p| p.is_file()) {
        Some(p) => p.clone(),
        None => panic!(
            "{name} is missing beside {}: build it with `cargo build -p swiftlet-tests --bins` (cargo xtask test does)",
            exe.display()
        ),
    }
}

/// The workload generator.
pub fn binary() -> PathBuf {
    sibling_binary("swiftlet-workload")
}

/// cgroup.procs files a new process writes itself into before exec.
fn procs_files(fs: &CgroupFs, rel: &str) -> Vec<CString> {
    let controllers: &[&str] = match fs.version() {
        Version::V1 => &["memory", "cpu", "cpuacct", "pids", "freezer"],
        Version::V2 => &["memory"],
    };
    controllers
        .iter()
        .map(|c| fs.controller_dir(c, rel).join("cgroup.procs"))
        .filter(|p| p.exists())
        .map(|p| CString::new(p.into_os_string().into_encoded_bytes()).expect("no NUL in path"))
        .collect()
}

/// Makes `cmd` start inside cgroup `rel`: the child moves itself between
/// fork and exec, so nothing it does is charged elsewhere.
pub fn in_cgroup(cmd: &mut Command, fs: &CgroupFs, rel: &str) {
    let files = procs_files(fs, rel);
    // SAFETY: the closure only calls async-signal-safe functions (open,
    // write, close) on data prepared before fork.
    unsafe {
        cmd.pre_exec(move || {
            for f in &files {
                let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let r = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if r != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// A `swiftlet-workload steps` process in a cgroup, killed on drop.
pub struct Steps {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Steps {
    pub fn spawn(fs: &CgroupFs, rel: &str) -> Steps {
        let mut cmd = Command::new(binary());
        cmd.arg("steps").stdin(Stdio::piped()).stdout(Stdio::piped());
        in_cgroup(&mut cmd, fs, rel);
        let mut child = cmd.spawn().expect("spawn swiftlet-workload");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Steps { child, stdin, stdout }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the process ended, if it has.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("wait for the workload")
    }

    /// Sends one command and waits for its `ok`.
    pub fn run(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("write to workload");
        self.stdin.flush().expect("flush workload stdin");
        let mut reply = String::new();
        self.stdout.read_line(&mut reply).expect("read workload reply");
        assert_eq!(reply.trim(), "ok", "workload command `{command}` failed: {reply}");
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
