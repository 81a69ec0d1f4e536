/* The sandbox's pause process: holds the pod's namespaces, reaps orphaned
 * children (it is PID 1 when the pod shares a PID namespace), and exits on
 * SIGINT/SIGTERM. Built static by `cargo xtask`, like Kubernetes' own. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
        static const char v[] = "swiftlet pause 1.0\n";
        write(1, v, sizeof v - 1);
        return 0;
    }
    struct sigaction sa = {0};
    sa.sa_handler = stop;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;) pause();
}
