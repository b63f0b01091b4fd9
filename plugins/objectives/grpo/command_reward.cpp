// command_reward.cpp — the reward function `command`: any program as a verifier (a Python script running a
// completion's code against tests, a checker of a proof, a judge), without C++. For each completion it runs
// `[reward] command` through /bin/sh with the completion's text on stdin and the prompt and the answer in the
// environment (DEW_PROMPT, DEW_ANSWER, DEW_FINISH_REASON); the score is the number on the last non-blank line of the
// program's standard output (the exit status is not read: a failing test suite prints its 0). A program that prints no
// number scores NaN (not scored); one still running after `command_timeout` seconds is killed with its process group
// and scores `command_timeout_score` (0). Up to `command_parallel` programs run at once (default: 4).
// Invariants: every child is reaped before score() returns; a child never outlives its timeout by more than the poll
// interval; a program that cannot be started (fork or pipe failing) is an error naming the command; a program that
// stops reading its stdin does not kill the trainer (SIGPIPE is blocked around each write and the pending one taken);
// the child runs only async-signal-safe calls between fork and exec (its environment is built before the fork); of a
// program's output the last 64 KiB are kept; the pipes are close-on-exec, so no program holds another's stdin open.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <dew/reward.hpp>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// The number on the last non-blank line of `out`, NaN when there is none.
double last_number(const std::string& out) {
  size_t end = out.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return std::numeric_limits<double>::quiet_NaN();
  const size_t begin = out.rfind('\n', end);
  const std::string line =
      out.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
  char* stop = nullptr;
  const double v = std::strtod(line.c_str(), &stop);
  while (stop && *stop && std::isspace(static_cast<unsigned char>(*stop))) ++stop;
  return stop != line.c_str() && stop && *stop == '\0' && std::isfinite(v) ? v
                                                                           : std::numeric_limits<double>::quiet_NaN();
}

class CommandReward final : public dew::Reward {
 public:
  explicit CommandReward(const dew::Options& o) {
    command_ = o.get_string("command", "");
    DEW_USAGE_CHECK(!command_.empty(), "reward 'command' needs [reward] command (a shell command line)");
    timeout_ = o.get_double("command_timeout", 10.0);
    DEW_USAGE_CHECK(timeout_ > 0, "option 'reward.command_timeout' must be > 0 seconds, got ", timeout_);
    timeout_score_ = o.get_double("command_timeout_score", 0.0);
    parallel_ = o.get_int("command_parallel", 4);
    DEW_USAGE_CHECK(parallel_ >= 1, "option 'reward.command_parallel' must be >= 1, got ", parallel_);
  }

  std::vector<double> score(const std::vector<dew::Completion>& cs) override {
    std::vector<double> out(cs.size(), std::numeric_limits<double>::quiet_NaN());
    std::vector<Child> running;
    size_t next = 0;
    while (next < cs.size() || !running.empty()) {
      while (next < cs.size() && int64_t(running.size()) < parallel_) {
        running.push_back(start(cs[next], next));
        ++next;
      }
      poll_once(running, out);
    }
    return out;
  }

 private:
  struct Child {
    pid_t pid = -1;
    int in = -1, out = -1;  // our ends: the child's stdin (written), its stdout (read)
    size_t index = 0;
    std::string input, output;
    size_t written = 0;
    Clock::time_point deadline;
  };

  Child start(const dew::Completion& c, size_t index) {
    int to_child[2], from_child[2];
    // Close-on-exec: a program started later must not hold this one's stdin open (it would never see its end).
    DEW_CHECK(pipe2(to_child, O_CLOEXEC) == 0, "reward 'command': pipe() failed: ", std::strerror(errno));
    if (pipe2(from_child, O_CLOEXEC) != 0) {
      close(to_child[0]);
      close(to_child[1]);
      throw dew::Error(dew::ErrorKind::runtime, "reward 'command': pipe() failed: " + std::string(std::strerror(errno)),
                       __FILE__, __LINE__);
    }
    // The child's environment: ours without the three variables, then them.
    std::vector<std::string> env_text;
    for (char** e = environ; e && *e; ++e)
      if (std::strncmp(*e, "DEW_PROMPT=", 11) != 0 && std::strncmp(*e, "DEW_ANSWER=", 11) != 0 &&
          std::strncmp(*e, "DEW_FINISH_REASON=", 18) != 0)
        env_text.emplace_back(*e);
    env_text.push_back("DEW_PROMPT=" + c.prompt);
    env_text.push_back("DEW_ANSWER=" + c.answer);
    env_text.push_back("DEW_FINISH_REASON=" + c.finish_reason);
    std::vector<char*> envp;
    for (std::string& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    const char* argv[] = {"sh", "-c", command_.c_str(), nullptr};
    const pid_t pid = fork();
    if (pid == 0) {  // the child: its own process group (killed whole at the timeout), the pipes as stdin / stdout
      setpgid(0, 0);
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[0]);
      close(to_child[1]);
      close(from_child[0]);
      close(from_child[1]);
      execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    if (pid < 0) {
      close(to_child[1]);
      close(from_child[0]);
      throw dew::Error(dew::ErrorKind::runtime, "reward 'command': fork() failed: " + std::string(std::strerror(errno)),
                       __FILE__, __LINE__);
    }
    setpgid(pid, pid);  // also here: whichever runs first
    Child ch;
    ch.pid = pid;
    ch.in = to_child[1];
    ch.out = from_child[0];
    ch.index = index;
    ch.input = c.text;
    ch.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_));
    fcntl(ch.in, F_SETFL, fcntl(ch.in, F_GETFL) | O_NONBLOCK);
    if (ch.input.empty()) {
      close(ch.in);
      ch.in = -1;
    }
    return ch;
  }

  // Feeds stdin, drains stdout, and finishes the children whose stdout closed or whose time is up.
  void poll_once(std::vector<Child>& running, std::vector<double>& out) {
    std::vector<pollfd> fds;
    for (const Child& ch : running) {
      fds.push_back({ch.out, POLLIN, 0});
      if (ch.in >= 0) fds.push_back({ch.in, POLLOUT, 0});
    }
    poll(fds.data(), nfds_t(fds.size()), 20);
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < running.size();) {
      Child& ch = running[i];
      if (ch.in >= 0) {
        const ssize_t n = write_without_sigpipe(ch.in, ch.input.data() + ch.written, ch.input.size() - ch.written);
        if (n > 0) ch.written += size_t(n);
        if (ch.written == ch.input.size() || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          close(ch.in);
          ch.in = -1;
        }
      }
      bool closed = false;
      for (;;) {
        pollfd p{ch.out, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
        char buf[4096];
        const ssize_t n = read(ch.out, buf, sizeof buf);
        if (n > 0) {
          ch.output.append(buf, size_t(n));
          if (ch.output.size() > kKeptOutput) ch.output.erase(0, ch.output.size() - kKeptOutput);
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        closed = true;  // EOF (or an error): the program is done writing
        break;
      }
      const bool late = !closed && now >= ch.deadline;
      if (!closed && !late) {
        ++i;
        continue;
      }
      if (late) kill(-ch.pid, SIGKILL);
      if (ch.in >= 0) close(ch.in);
      close(ch.out);
      int status = 0;
      while (waitpid(ch.pid, &status, 0) < 0 && errno == EINTR) {
      }
      if (late) kill(-ch.pid, SIGKILL);  // what the program left behind in its group
      out[ch.index] = late ? timeout_score_ : last_number(ch.output);
      running.erase(running.begin() + std::ptrdiff_t(i));
    }
  }

  // write() with SIGPIPE blocked in this thread: a reader gone gives EPIPE, and the signal it raised is taken.
  static ssize_t write_without_sigpipe(int fd, const char* data, size_t n) {
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    const ssize_t written = write(fd, data, n);
    const int saved = errno;
    if (written < 0 && saved == EPIPE) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    errno = saved;
    return written;
  }

  static constexpr size_t kKeptOutput = 65536;
  std::string command_;
  double timeout_ = 10.0, timeout_score_ = 0.0;
  int64_t parallel_ = 4;
};

}  // namespace

void register_command_reward(dew::Registrar& registrar) {
  registrar.add<dew::Reward>(
      {.name = "command",
       .description = "any program as a verifier: the completion on stdin, DEW_PROMPT / DEW_ANSWER in the "
                      "environment, the score the number on its last output line",
       .factory = [](const dew::Options& o) -> std::shared_ptr<dew::Reward> {
         return std::make_shared<CommandReward>(o);
       },
       .options = {{"command", "", "the shell command line run for each completion (required by this reward)"},
                   {"command_timeout", "10", "seconds before a program is killed (with its process group)"},
                   {"command_timeout_score", "0", "the score of a program killed at the timeout"},
                   {"command_parallel", "4", "programs running at once"}}});
}
