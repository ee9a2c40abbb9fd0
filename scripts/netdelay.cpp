// netdelay: holds every packet of one netfilter queue for a fixed time, then lets it go. The emulated cluster's
// latency (scripts/cluster.sh), where the kernel has no netem: each node's outgoing packets are queued to this process
// by an nftables rule, so any two nodes are DELAY apart one way. Order is kept (one FIFO, one fixed delay).
//
//   netdelay --queue N --delay-us D      (root, inside the node's namespace; ends on SIGTERM or SIGINT)
//
// One thread: it sleeps in ppoll until a packet arrives or the oldest held one is due, reads what the socket has,
// and gives the verdicts that are due. Only the packet's metadata is copied (its id); GSO packets are queued whole,
// so a bulk transfer costs one verdict per 64 KiB, not per 1500 bytes. Within 20 µs of a release the thread spins,
// and it asks for real-time priority where it may: sleeping alone has tens of microseconds of slack.
// glibc's netinet/in.h before the kernel's headers, which then leave its definitions alone.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct Held {
  std::uint32_t id;
  Clock::time_point due;
};

std::deque<Held> held;
Clock::duration delay;
volatile std::sig_atomic_t stopping = 0;
unsigned long long passed = 0;

int on_packet(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void*) {
  const nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
  if (ph != nullptr) held.push_back({ntohl(ph->packet_id), Clock::now() + delay});
  return 0;
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "netdelay: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int queue = -1;
  long delay_us = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--queue") queue = std::atoi(argv[i + 1]);
    else if (a == "--delay-us") delay_us = std::atol(argv[i + 1]);
  }
  if (queue < 0 || queue > 65535 || delay_us < 0 || delay_us > 10'000'000) {
    std::fprintf(stderr, "usage: netdelay --queue N (0..65535) --delay-us D (0..10000000)\n");
    return 2;
  }
  delay = std::chrono::microseconds(delay_us);
  std::signal(SIGTERM, [](int) { stopping = 1; });
  std::signal(SIGINT, [](int) { stopping = 1; });
  prctl(PR_SET_TIMERSLACK, 1UL);
  sched_param sp{};
  sp.sched_priority = 10;
  if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) std::fprintf(stderr, "netdelay: no real-time priority (%s): the delay will jitter more\n", std::strerror(errno));

  nfq_handle* h = nfq_open();
  if (h == nullptr) die("nfq_open");
  nfq_q_handle* qh = nfq_create_queue(h, static_cast<std::uint16_t>(queue), &on_packet, nullptr);
  if (qh == nullptr) die("nfq_create_queue (is another process bound to this queue?)");
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) die("nfq_set_mode");
  (void)nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
  (void)nfq_set_queue_maxlen(qh, 65536);
  const int fd = nfq_fd(h);
  int rcvbuf = 8 << 20;
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
  const int one = 1;
  (void)setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
  std::fprintf(stderr, "netdelay: queue %d, %ld us\n", queue, delay_us);

  alignas(8) char buf[65536];
  while (!stopping) {
    // Give what is due; spin the last 20 µs before the next release.
    for (;;) {
      const auto now = Clock::now();
      while (!held.empty() && held.front().due <= now) {
        (void)nfq_set_verdict(qh, held.front().id, NF_ACCEPT, 0, nullptr);
        held.pop_front();
        ++passed;
      }
      if (held.empty() || held.front().due - now > std::chrono::microseconds(20)) break;
    }
    timespec ts{};
    timespec* tsp = nullptr;
    if (!held.empty()) {
      const auto wait = held.front().due - Clock::now() - std::chrono::microseconds(20);
      const long long ns = wait.count() > 0 ? std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count() : 0;
      ts.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
      ts.tv_nsec = static_cast<long>(ns % 1'000'000'000);
      tsp = &ts;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ppoll(&p, 1, tsp, nullptr);
    if (r < 0 && errno != EINTR) die("ppoll");
    if (r > 0) {
      // Everything the socket holds now, without blocking.
      for (;;) {
        const ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
          if (errno == ENOBUFS) continue;  // the kernel dropped some: those packets are lost, as on a congested link
          die("recv");
        }
        nfq_handle_packet(h, buf, static_cast<int>(n));
      }
    }
  }
  // Let what is held go before leaving: the rule is removed by the caller, after this process ends.
  for (const Held& x : held) (void)nfq_set_verdict(qh, x.id, NF_ACCEPT, 0, nullptr);
  std::fprintf(stderr, "netdelay: queue %d: %llu packets passed\n", queue, passed + held.size());
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
}
