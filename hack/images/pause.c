/* pause for the local bench: sleeps in pause(2), reaps children, exits on TERM/INT. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(int argc, char **argv) {
	struct sigaction sa;
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("rsandbox-pause 1");
		return 0;
	}
	if (getpid() != 1) fprintf(stderr, "pause: not pid 1\n");
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_term;
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0) return 1;
	sa.sa_handler = on_chld;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	if (sigaction(SIGCHLD, &sa, NULL) < 0) return 2;
	for (;;) pause();
}
