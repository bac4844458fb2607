/* The pod sandbox's pause process: holds the pod's namespaces open and reaps zombies. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_terminate(int signal_number) {
  (void)signal_number;
  _exit(0);
}

static void on_child(int signal_number) {
  (void)signal_number;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction terminate = {.sa_handler = on_terminate};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &terminate, NULL) < 0 || sigaction(SIGTERM, &terminate, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
