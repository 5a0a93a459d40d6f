//! rsandbox-pause: the program the pod's pause process runs (see `src/pod/pause.rs`).
//!
//! The shim forks a child that enters the pod's namespaces, pivots into an empty root, drops
//! every privilege and then executes this program from a sealed memfd (the image is embedded in
//! the shim by `build.rs`). Executing it gives the pause a clean address space: nothing of the
//! shim's memory (its configuration, its environment, the pod's secrets in flight) stays in a
//! process that a container of a shared-PID pod can read with `CAP_SYS_PTRACE`.
//!
//! It is `no_std`, links nothing (no libc) and makes eight kinds of system call, so it is a few
//! kilobytes and costs a few pages per pod. What it does:
//! 1. marks itself non-dumpable again (`execve` resets the flag the shim set);
//! 2. blocks SIGCHLD, SIGTERM, SIGINT, SIGHUP (it takes them with `rt_sigtimedwait`);
//! 3. installs a seccomp allow-list of exactly the calls it makes from then on (`no_new_privs`
//!    is inherited from the shim's child, so no privilege is needed); any other call kills it;
//! 4. reports ready: one 0 byte on descriptor 0 (the shim's status pipe), then closes it;
//! 5. loops: SIGCHLD reaps every exited child (it is PID 1 of a shared PID namespace), SIGTERM,
//!    SIGINT and SIGHUP end it with status 0 when they come from outside its PID namespace
//!    (the shim, the node: sent with kill(2)/tgkill(2), whose sender the kernel states). As PID 1, a signal from inside (a container of the pod with
//!    `CAP_KILL`, which every container has by default) is ignored: the kernel already drops
//!    the others (SIGKILL and SIGSTOP included) for a PID 1 with no handler, but these four are
//!    blocked for `rt_sigtimedwait`, and blocked signals are always queued. The runc path's
//!    pause container exits on a container's SIGTERM; this one does not.
//!
//! Built by `build.rs` with the toolchain's `rustc` alone: `-C panic=abort`, no start files, no
//! standard library, static, no PIE. Only x86_64 and aarch64 Linux.
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};

#[cfg(target_arch = "x86_64")]
mod arch {
    pub const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
    pub const SYS_RT_SIGRETURN: u32 = 15;
    pub const SYS_RT_SIGPROCMASK: u32 = 14;
    pub const SYS_EXIT: u32 = 60;
    pub const SYS_WAIT4: u32 = 61;
    pub const SYS_PRCTL: u32 = 157;
    pub const SYS_RT_SIGTIMEDWAIT: u32 = 128;
    pub const SYS_RESTART_SYSCALL: u32 = 219;
    pub const SYS_EXIT_GROUP: u32 = 231;
    pub const SYS_WRITE: u32 = 1;
    pub const SYS_CLOSE: u32 = 3;
    pub const SYS_GETPID: u32 = 39;
}

#[cfg(target_arch = "aarch64")]
mod arch {
    pub const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
    pub const SYS_RT_SIGRETURN: u32 = 139;
    pub const SYS_RT_SIGPROCMASK: u32 = 135;
    pub const SYS_EXIT: u32 = 93;
    pub const SYS_WAIT4: u32 = 260;
    pub const SYS_PRCTL: u32 = 167;
    pub const SYS_RT_SIGTIMEDWAIT: u32 = 137;
    pub const SYS_RESTART_SYSCALL: u32 = 128;
    pub const SYS_EXIT_GROUP: u32 = 94;
    pub const SYS_WRITE: u32 = 64;
    pub const SYS_CLOSE: u32 = 57;
    pub const SYS_GETPID: u32 = 172;
}

use arch::*;

#[cfg(target_arch = "x86_64")]
global_asm!(
    ".globl _start",
    "_start:",
    "xor ebp, ebp",
    "and rsp, -16",
    "call {main}",
    "ud2",
    main = sym pause_main,
);

#[cfg(target_arch = "aarch64")]
global_asm!(
    ".globl _start",
    "_start:",
    "mov x29, xzr",
    "mov x30, xzr",
    "bl {main}",
    "brk #0",
    main = sym pause_main,
);

/// A raw system call with up to four arguments; returns the kernel's value (-errno on error).
#[cfg(target_arch = "x86_64")]
unsafe fn syscall4(nr: u32, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: the caller passes arguments valid for `nr`; `syscall` clobbers rcx and r11.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a, in("rsi") b, in("rdx") c, in("r10") d,
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(target_arch = "aarch64")]
unsafe fn syscall4(nr: u32, a: usize, b: usize, c: usize, d: usize) -> isize {
    let ret: isize;
    // SAFETY: the caller passes arguments valid for `nr`.
    unsafe {
        asm!(
            "svc 0",
            in("x8") nr as usize,
            inlateout("x0") a as isize => ret,
            in("x1") b, in("x2") c, in("x3") d,
            options(nostack),
        );
    }
    ret
}

fn exit(code: usize) -> ! {
    loop {
        // SAFETY: exit_group takes a status and does not return.
        unsafe { syscall4(SYS_EXIT_GROUP, code, 0, 0, 0) };
    }
}

const SIGHUP: u32 = 1;
const SIGINT: u32 = 2;
const SIGTERM: u32 = 15;
const SIGCHLD: u32 = 17;
/// The signals the loop takes: the kernel's 64-bit sigset, bit n-1 for signal n.
const WAITED: u64 = 1 << (SIGHUP - 1) | 1 << (SIGINT - 1) | 1 << (SIGTERM - 1) | 1 << (SIGCHLD - 1);
const SIG_SETMASK: usize = 2;
const PR_SET_DUMPABLE: usize = 4;
const PR_SET_SECCOMP: usize = 22;
const SECCOMP_MODE_FILTER: usize = 2;
const WNOHANG: usize = 1;
/// Indexes of `si_code` and `si_pid` in siginfo_t as 32-bit words (signo, errno, code,
/// padding, pid).
const SI_CODE_WORD: usize = 2;
const SI_PID_WORD: usize = 4;
/// `si_code` of kill(2) and of tkill(2)/tgkill(2): the kernel itself fills in `si_pid` for
/// these; any other code (SI_QUEUE, ...) lets the sender write `si_pid`.
const SI_USER: u32 = 0;
const SI_TKILL: u32 = -6i32 as u32;

const PR_SET_NAME: usize = 15;
/// The shim's end of the ready report: one 0 byte written here once the filter is on.
const READY_FD: usize = 0;

/// Exit codes that tell the shim which set-up step failed (`describe_exit` in
/// `src/pod/pause_image.rs`).
const EXIT_DUMPABLE: usize = 120;
const EXIT_SIGMASK: usize = 121;
const EXIT_SECCOMP: usize = 122;
const EXIT_READY: usize = 123;
const EXIT_NAME: usize = 124;

/// One classic BPF instruction (`struct sock_filter`).
#[repr(C)]
struct SockFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// `struct sock_fprog`.
#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const SockFilter,
}

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// Offsets in `struct seccomp_data` (little-endian: the low half of args[0] comes first).
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LO: u32 = 16;
const ARG0_HI: u32 = 20;

const FILTER_LEN: usize = 18;
/// Where the check of `write`/`close` (only on [`READY_FD`]) starts, and the two verdicts.
const FD_CHECK: usize = 12;
const ALLOW: usize = 16;
const KILL: usize = 17;

const fn load(offset: u32) -> SockFilter {
    SockFilter {
        code: BPF_LD_W_ABS,
        jt: 0,
        jf: 0,
        k: offset,
    }
}

const fn ret(action: u32) -> SockFilter {
    SockFilter {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k: action,
    }
}

/// Instruction `at`: if the loaded word is `k`, go to instruction `to`, else to the next one.
const fn jump_if(at: usize, k: u32, to: usize) -> SockFilter {
    SockFilter {
        code: BPF_JEQ_K,
        jt: (to - at - 1) as u8,
        jf: 0,
        k,
    }
}

/// Instruction `at`: if the loaded word is `k`, go on, else kill.
const fn require(at: usize, k: u32) -> SockFilter {
    SockFilter {
        code: BPF_JEQ_K,
        jt: 0,
        jf: (KILL - at - 1) as u8,
        k,
    }
}

/// The allow-list: our architecture, the calls of the loop, and `write`/`close` of the ready
/// descriptor only; anything else kills the process (a pause that makes any other call has
/// been subverted, or is a bug).
static FILTER: [SockFilter; FILTER_LEN] = [
    load(ARCH),
    require(1, AUDIT_ARCH),
    load(NR),
    jump_if(3, SYS_RT_SIGTIMEDWAIT, ALLOW),
    jump_if(4, SYS_WAIT4, ALLOW),
    jump_if(5, SYS_RT_SIGRETURN, ALLOW),
    jump_if(6, SYS_RESTART_SYSCALL, ALLOW),
    jump_if(7, SYS_EXIT_GROUP, ALLOW),
    jump_if(8, SYS_EXIT, ALLOW),
    jump_if(9, SYS_WRITE, FD_CHECK),
    jump_if(10, SYS_CLOSE, FD_CHECK),
    ret(SECCOMP_RET_KILL_PROCESS),
    // FD_CHECK: the whole 64-bit descriptor argument must be READY_FD.
    load(ARG0_LO),
    require(13, READY_FD as u32),
    load(ARG0_HI),
    require(15, 0),
    // ALLOW
    ret(SECCOMP_RET_ALLOW),
    // KILL
    ret(SECCOMP_RET_KILL_PROCESS),
];

#[unsafe(no_mangle)]
extern "C" fn pause_main() -> ! {
    let set: u64 = WAITED;
    // SAFETY: each call gets arguments valid for it: integers, and pointers to `set`, `prog`,
    // `ready`, `name` and `info`, which outlive the call.
    unsafe {
        if syscall4(SYS_PRCTL, PR_SET_DUMPABLE, 0, 0, 0) != 0 {
            exit(EXIT_DUMPABLE);
        }
        // `ps` in a shared-PID pod shows PID 1 as `pause` (an exec from a descriptor would
        // otherwise name it after the descriptor's number on older kernels).
        let name = b"pause\0";
        if syscall4(SYS_PRCTL, PR_SET_NAME, name.as_ptr() as usize, 0, 0) != 0 {
            exit(EXIT_NAME);
        }
        if syscall4(
            SYS_RT_SIGPROCMASK,
            SIG_SETMASK,
            &set as *const u64 as usize,
            0,
            8,
        ) != 0
        {
            exit(EXIT_SIGMASK);
        }
        let prog = SockFprog {
            len: FILTER_LEN as u16,
            filter: FILTER.as_ptr(),
        };
        let prog = &prog as *const SockFprog as usize;
        let pid1 = syscall4(SYS_GETPID, 0, 0, 0, 0) == 1;
        if syscall4(SYS_PRCTL, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0) != 0 {
            exit(EXIT_SECCOMP);
        }
        let ready = [0u8];
        if syscall4(SYS_WRITE, READY_FD, ready.as_ptr() as usize, 1, 0) != 1
            || syscall4(SYS_CLOSE, READY_FD, 0, 0, 0) != 0
        {
            exit(EXIT_READY);
        }
        // siginfo_t is 128 bytes; the kernel fills it for every signal it returns.
        let mut info = core::mem::MaybeUninit::<[u32; 32]>::uninit();
        let info = info.as_mut_ptr();
        loop {
            let sig = syscall4(
                SYS_RT_SIGTIMEDWAIT,
                &set as *const u64 as usize,
                info as usize,
                0,
                8,
            );
            if sig == SIGCHLD as isize {
                // PID 1 of the pod's PID namespace adopts orphans: reap them all.
                while syscall4(SYS_WAIT4, usize::MAX, 0, WNOHANG, 0) > 0 {}
            } else if sig == SIGTERM as isize || sig == SIGINT as isize || sig == SIGHUP as isize {
                // si_pid (bytes 16..20 on 64-bit Linux) is the sender's pid in our PID
                // namespace, 0 for a sender outside it; trusted only where the kernel wrote
                // it (rt_sigqueueinfo lets a sender in the pod forge si_pid = 0).
                let code = (*info)[SI_CODE_WORD];
                let from_outside =
                    (code == SI_USER || code == SI_TKILL) && (*info)[SI_PID_WORD] == 0;
                if !pid1 || from_outside {
                    exit(0);
                }
            }
        }
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    exit(127)
}
