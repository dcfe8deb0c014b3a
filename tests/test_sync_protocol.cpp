// The synchronous protocol's decisions (dtf/ps/sync_protocol.hpp) over every interleaving of
// 2 ps x 3 workers with N = 2 for 2 steps: each worker may die at any point (and come back
// once, as a new incarnation), and may retry any request once per step (a timed-out request
// sent again). In every reachable state the invariants of docs/design/sync-protocol.md hold:
// I1 every ps applies the same set for a step, I2 a decided set's parts are staged on ps 1,
// I3 ps 1 is at most one step behind ps 0 and never ahead, I5 a retry changes nothing; and in
// every state where no worker can move, I4: the steps completed on both ps, or ps 0 failed the
// job because fewer than N workers were left. A third enumeration sends each part in two
// segments (docs/design/large-models.md): ps 1's both staged, ps 0's first staged on ps 0
// before the commit carries its second; a worker may die between any two. The honest workers
// carry ps 1's receipts to ps 0. A fourth enumeration runs with the proofs a secret gives
// (dtf/ps/sync_proofs.hpp, on the real MACs) and adds a hostile worker
// (docs/design/sync-protocol.md, section 3) that may send any message its own key allows, at
// any point: its parts staged at the honest rate or another, commits with the receipts it
// holds, with another part's, a made-up one or none, forwards of decisions ps 0 made, altered
// ones and made-up ones. Every message of it that is refused must leave the state machines as
// they were, and I1-I5 must hold in every state (I4: for the honest workers).
#include <catch2/catch.hpp>

#include <dtf/ps/sync_protocol.hpp>
#include <dtf/transport/credentials.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace sync_protocol_test {
using dtf::ps_detail::contribution_id;
using dtf::ps_detail::step_rate;
using dtf::ps_detail::sync_admission;
using dtf::ps_detail::sync_decision;
using dtf::ps_detail::sync_proofs;
using dtf::ps_detail::sync_receipt;
using dtf::ps_detail::sync_staging;

// The ps's key and places, as a ps derives them from the master secret and its init.
inline const std::string ps_key = dtf::derive_ps_key("model-check-master-secret");
inline const sync_proofs proofs0{ps_key, 0, 2}, proofs1{ps_key, 1, 2};
// The honest workers' rate; a hostile worker may use the other. A part's int is its rate.
inline const step_rate rates[2] = {{dtf::detail::update_kind::gradient, 0.5f}, {dtf::detail::update_kind::gradient, std::nullopt}};

constexpr std::size_t workers = 3, n = 2;
constexpr std::int64_t steps = 2;
// Restarts and retries allowed in one run (each worker at most one of each per step): both at
// once give 2.2 million states, so the test enumerates retries without restarts, then restarts
// without retries. Either enumeration finds today's order (a commit before the parts reach ps 1).
inline int restarts_allowed = 0, retries_allowed = 0;
inline bool segmented = false;  // each part in two segments
inline int hostile_budget = -1;  // >= 0: a hostile worker that may stage this many parts (and commit them)
// A violated invariant (REQUIRE per check would cost more than the enumeration).
struct violation : std::logic_error {
  using std::logic_error::logic_error;
};
#define EXPECT(cond) \
  if (!(cond)) throw violation(#cond)

struct worker {
  enum pc_t : std::uint8_t { pull, stage, stage_b, stage_0, commit, await, forward, finished, failed, dead, absent } pc = pull;
  std::int64_t t = 0;
  std::uint64_t incarnation = 1, sequence = 0;
  std::optional<sync_decision> d;
  bool retried = false;    // this step's retry is spent
  bool restarted = false;  // its one restart is spent
  std::optional<sync_receipt> receipt;  // ps 1's, for this step's part
};

// worker.3, which holds its own key only: what it holds are the receipts ps 1 gave it.
struct intruder {
  std::vector<sync_receipt> receipts;
  int budget = 0;  // its parts it may stage, left (each it may commit)
};

struct world {
  sync_admission ps0;
  sync_staging<int> ps1;
  sync_staging<int> ps0s;  // ps 0's staged segments (segmented)
  std::vector<std::vector<contribution_id>> applied0, applied1;  // per step: the set applied
  bool failed = false;
  int restarts = restarts_allowed, retries = retries_allowed;  // left, for the whole run
  std::array<worker, workers> w;
  intruder h;

  std::string key() const {
    std::string k = std::to_string(ps0.step()) + "|" + std::to_string(ps1.step()) + "|" + (failed ? "F" : "-") +
                    std::to_string(restarts) + std::to_string(retries);
    auto ids = [&](const std::vector<contribution_id>& v) {
      for (const auto& id : v) k += id.worker + "." + std::to_string(id.incarnation) + "." + std::to_string(id.sequence) + ",";
      k += ";";
    };
    for (const auto& e : ps0.pending())
      k += e.id.worker + "." + std::to_string(e.id.incarnation) + "." + std::to_string(e.id.sequence) +
           (e.rate == rates[0] ? "," : "',");
    k += std::to_string(h.budget) + ";";
    for (const auto& r : h.receipts)
      k += std::to_string(r.step) + "." + std::to_string(r.id.incarnation) + (r.rate == rates[0] ? "," : "',");
    ids(ps1.staged_ids());
    for (const auto& id : ps1.staged_ids()) k += std::to_string(ps1.received(id));
    ids(ps0s.staged_ids());
    for (const auto& a : applied0) ids(a);
    k += "/";
    for (const auto& a : applied1) ids(a);
    for (const auto& x : w) {
      k += "|" + std::to_string(int(x.pc)) + std::to_string(x.t) + std::to_string(x.incarnation) +
           std::to_string(x.sequence) + (x.retried ? "r" : "") + (x.restarted ? "R" : "");  // (a receipt is missing only for a step decided)
      if (x.d) ids(x.d->ids);
    }
    return k;
  }
};

contribution_id id_of(const world& s, std::size_t i) {
  return {"worker." + std::to_string(i), s.w[i].incarnation, s.w[i].sequence};
}

constexpr auto no_merge = [](int&, int&&) {};
std::uint32_t segments() { return segmented ? 2 : 1; }

std::size_t live(const world& s) {
  std::size_t k = 0;
  for (const auto& x : s.w) k += x.pc != worker::dead && x.pc != worker::absent;
  return k;
}

// ps 1 applies decision d (a forward): a second forward changes nothing.
void apply_on_ps1(world& s, const sync_decision& d) {
  const auto before = s.ps1.staged_ids();
  const auto step = s.ps1.step();
  const auto parts = s.ps1.parts_of(d);  // I2: throws when a part of d is missing
  if (!parts) {
    EXPECT(s.ps1.step() == step);  // I5
    EXPECT(s.ps1.staged_ids() == before);
    return;
  }
  for (const int* part : *parts) EXPECT(rates[*part] == d.rate);  // I1: the decision's rate, on every ps
  s.applied1.push_back(d.ids);
  s.ps1.advance();
}

// Decisions that took a part of the hostile worker, and that refused its commits (the
// enumeration reached them).
inline std::size_t hostile_admitted = 0, hostile_refused = 0;

// ps 0 decided a step (r): its rate is the honest workers' (a hostile worker has one name, and
// N = 2), and only the hostile worker's commits are refused.
void decided(world& x, const sync_admission::result& r) {
  x.ps0s.advance();
  x.applied0.push_back(r.decision->ids);
  EXPECT(r.decision->rate == rates[0]);
  for (const auto& e : r.refused) EXPECT(e.id.worker == "worker.3");
  hostile_refused += !r.refused.empty();
  for (const auto& id : r.decision->ids) hostile_admitted += id.worker == "worker.3";
}

// f(copy) must throw errc::invalid_argument (an error to the sender alone) and leave the copy
// as it was (a message refused changes nothing).
template <class Machine, class F>
void refused(const Machine& m, F&& f) {
  Machine copy = m;
  bool threw = false;
  try {
    f(copy);
  } catch (const dtf::error& e) {
    EXPECT(e.code() == dtf::make_error_code(dtf::errc::invalid_argument));
    threw = true;
  }
  EXPECT(threw);
  if constexpr (std::is_same_v<Machine, sync_admission>) {
    EXPECT(copy == m);
  } else {
    EXPECT(copy.step() == m.step());
    EXPECT(copy.staged_ids() == m.staged_ids());
  }
}

// Every transition of the hostile worker from s, and a check of each of its messages that must
// be refused. Its ids: worker.3, incarnation 1 or 2, contribution 0.
std::vector<world> hostile_moves(const world& s) {
  std::vector<world> out;
  const std::int64_t t = s.ps0.step();
  auto id = [](std::uint64_t k) { return contribution_id{"worker.3", k, 0}; };
  // Forwards to ps 1: ps 0's decision of ps 1's step (a pull's) applies it; forged and
  // altered ones are refused.
  if (const auto d = s.ps0.decision_of(s.ps1.step())) {
    world x = s;
    apply_on_ps1(x, *d);
    out.push_back(std::move(x));
  }
  // Made up: its own two parts, its part and an honest one's, two honest ones (each honest
  // worker's first contribution), at either rate.
  std::vector<sync_decision> forged{{s.ps1.step(), {id(1), id(2)}, rates[0], {}},
                                    {s.ps1.step(), {id(1), {"worker.0", 1, 0}}, rates[1], {}},
                                    {s.ps1.step(), {{"worker.0", 1, 0}, {"worker.1", 1, 0}}, rates[0], {}}};
  for (std::int64_t step : {s.ps1.step() - 1, s.ps1.step()})
    if (const auto d = s.ps0.decision_of(step)) {
      auto a = *d;  // altered: reordered, another rate, another step, one id replaced
      std::swap(a.ids[0], a.ids[1]);
      forged.push_back(a);
      a = *d, a.rate = rates[1], forged.push_back(a);
      a = *d, a.step = step + 1, forged.push_back(a);
      a = *d, a.ids[1] = a.ids[1] == id(1) ? id(2) : id(1), forged.push_back(a);
    }
  for (const auto& d : forged) refused(s.ps1, [&](sync_staging<int>& p) { p.parts_of(d); });
  if (t >= steps) return out;
  for (std::uint64_t k = 1; k <= 2; ++k)
    for (int r = 0; r < 2; ++r) {
      // Stage its own part on ps 1, ps 1 at t (step 0: the space stays small): the receipt is
      // the part's first rate.
      if (s.h.budget > 0 && t == 0 && s.ps1.step() == t && !s.ps1.holds(id(k))) {
        world x = s;
        --x.h.budget;
        x.ps1.stage(id(k), t, int(r));
        const auto rc = x.ps1.receipt(id(k), rates[r]);
        EXPECT(rc);
        x.h.receipts.push_back(*rc);
        out.push_back(std::move(x));
      }
      if (s.ps1.step() < t) refused(s.ps1, [&](sync_staging<int>& p) { p.stage(id(k), t, int(r)); });
      if (s.ps0.recorded(id(k))) continue;  // a retry: changes nothing (I5)
      // Commit: without receipts, with a made-up one, with each it holds for another part.
      refused(s.ps0, [&](sync_admission& a) { a.commit(id(k), t, rates[r], {}); });
      sync_receipt made_up{1, t, id(k), rates[r], {}};
      made_up.mac[0] = 1;
      refused(s.ps0, [&](sync_admission& a) { a.commit(id(k), t, rates[r], {made_up}); });
      const sync_receipt want{1, t, id(k), rates[r], {}};
      for (const auto& rc : s.h.receipts) {
        if (rc.step == want.step && rc.id == want.id && rc.rate == want.rate) {
          world x = s;  // the receipt ps 1 gave for this part: admitted
          const auto res = x.ps0.commit(id(k), t, rates[r], {rc});
          EXPECT(res.v == sync_admission::verdict::pending || res.decided_now);
          if (res.decided_now) decided(x, res);
          out.push_back(std::move(x));
        } else {
          refused(s.ps0, [&](sync_admission& a) { a.commit(id(k), t, rates[r], {rc}); });
        }
      }
    }
  return out;
}

// Every transition one worker can make from s.
std::vector<world> moves(const world& s, std::size_t i) {
  std::vector<world> out;
  const worker& me = s.w[i];
  auto next = [&](auto&& f) {
    world x = s;
    f(x, x.w[i]);
    out.push_back(std::move(x));
  };
  if (me.pc == worker::dead) {
    if (!me.restarted && s.restarts > 0)
      next([](world& x, worker& w) {  // a restart: a new incarnation, from a pull
        --x.restarts;
        w = worker{worker::pull, 0, 2, 0, std::nullopt, false, true, std::nullopt};
      });
    return out;
  }
  if (me.pc == worker::finished || me.pc == worker::failed || me.pc == worker::absent) return out;
  next([&](world& x, worker& w) {  // dies here; ps 0 fails the job when fewer than N are left
    w.pc = worker::dead;
    if (live(x) < n) x.failed = true;
  });
  if (s.failed && me.pc != worker::stage && me.pc != worker::forward) {
    next([](world&, worker& w) { w.pc = worker::failed; });  // ps 0's error reaches it
    return out;
  }
  switch (me.pc) {
    case worker::pull:
      if (s.ps1.step() < s.ps0.step()) {
        next([](world& x, worker&) {  // a pull finds ps 1 behind: ps 0's decision, forwarded
          const auto d = x.ps0.decision_of(x.ps1.step());
          EXPECT(d);
          apply_on_ps1(x, *d);
        });
      } else if (s.ps0.step() >= steps) {
        next([](world&, worker& w) { w.pc = worker::finished; });
      } else {
        next([](world& x, worker& w) {
          w.t = x.ps0.step();
          w.pc = worker::stage;
          w.d.reset();
          w.retried = false;
        });
      }
      if (me.d && !me.retried && s.retries > 0)
        next([](world& x, worker& w) {  // the last forward again
          w.retried = true;
          --x.retries;
          apply_on_ps1(x, *w.d);
        });
      break;
    case worker::stage:
      next([&](world& x, worker& w) {
        x.ps1.stage(id_of(x, i), w.t, 0, segments(), 0, no_merge);
        w.pc = segmented ? worker::stage_b : worker::commit;
        // A part staged for a step ps 1 has finished gets no receipt (ps 0 drops its commit).
        w.receipt = x.ps1.receipt(id_of(x, i), rates[0]);
        EXPECT(w.receipt.has_value() == (!segmented && w.t == x.ps1.step()));
      });
      break;
    case worker::stage_b:  // ps 1's second segment
      next([&](world& x, worker& w) {
        x.ps1.stage(id_of(x, i), w.t, 1, 2, 0, no_merge);
        w.pc = worker::stage_0;
        w.receipt = x.ps1.receipt(id_of(x, i), rates[0]);
        EXPECT(w.receipt.has_value() == (w.t == x.ps1.step()));
      });
      break;
    case worker::stage_0:  // ps 0's first segment, staged on ps 0
      next([&](world& x, worker& w) {
        x.ps0s.stage(id_of(x, i), w.t, 0, 2, 0, no_merge);
        w.pc = worker::commit;
      });
      break;
    case worker::commit:
      next([&](world& x, worker& w) {
        // The commit carries ps 0's last segment: its others are staged there (or the step is over).
        if (segmented && w.t == x.ps0.step()) EXPECT(x.ps0s.held(id_of(x, i), 2, 1));
        std::vector<sync_receipt> receipts;
        if (w.receipt) receipts.push_back(*w.receipt);
        const auto r = x.ps0.commit(id_of(x, i), w.t, rates[0], receipts);
        if (r.decided_now) decided(x, r);
        EXPECT(r.v != sync_admission::verdict::duplicate);
        if (r.v == sync_admission::verdict::pending) {
          w.pc = worker::await;
          return;
        }
        ++w.sequence;  // answered
        w.d = r.decision;
        w.pc = r.decision ? worker::forward : worker::pull;
      });
      if (!me.retried && s.retries > 0)
        next([&](world& x, worker& w) {  // the stage again
          w.retried = true;
          --x.retries;
          const auto before = x.ps1.staged_ids();
          const auto before0 = x.ps0s.staged_ids();
          for (std::uint32_t k = 0; k < segments(); ++k)
            EXPECT(x.ps1.stage(id_of(x, i), w.t, k, segments(), 0, no_merge) != sync_staging<int>::verdict::staged);  // I5
          if (x.ps1.step() == w.t) EXPECT(x.ps1.receipt(id_of(x, i), rates[0]) == w.receipt);  // the same again
          if (segmented) EXPECT(x.ps0s.stage(id_of(x, i), w.t, 0, 2, 0, no_merge) != sync_staging<int>::verdict::staged);
          EXPECT(x.ps1.staged_ids() == before);
          EXPECT(x.ps0s.staged_ids() == before0);
        });
      break;
    case worker::await:
      if (const auto d = s.ps0.decision_of(me.t))
        next([&](world&, worker& w) {
          ++w.sequence;
          w.d = d;
          w.pc = worker::forward;
        });
      if (!me.retried && s.retries > 0)
        next([&](world& x, worker& w) {  // the commit again
          w.retried = true;
          --x.retries;
          const sync_admission before = x.ps0;
          const auto r = x.ps0.commit(id_of(x, i), w.t, rates[0], {});  // recorded: not checked again
          EXPECT(x.ps0 == before);  // I5
          EXPECT(r.v != sync_admission::verdict::pending);
          EXPECT(!r.decided_now);
          if (r.v == sync_admission::verdict::admitted) {
            ++w.sequence;
            w.d = r.decision;
            w.pc = worker::forward;
          }
        });
      break;
    case worker::forward:
      next([](world& x, worker& w) {
        apply_on_ps1(x, *w.d);
        w.pc = worker::pull;
      });
      break;
    default: break;
  }
  return out;
}

void check(const world& s) {
  // I3: ps 1 is at most one step behind ps 0, never ahead.
  EXPECT(s.ps1.step() <= s.ps0.step());
  EXPECT(s.ps0.step() - s.ps1.step() <= 1);
  // I1: the same set on both ps, of N distinct contributions.
  EXPECT(s.applied1.size() <= s.applied0.size());
  for (std::size_t t = 0; t < s.applied1.size(); ++t) EXPECT(s.applied1[t] == s.applied0[t]);
  for (const auto& a : s.applied0) {
    EXPECT(a.size() == n);
    EXPECT(std::set<contribution_id>(a.begin(), a.end()).size() == n);
  }
}
}  // namespace sync_protocol_test

namespace sync_protocol_test {
struct counts {
  std::size_t states = 0, terminal = 0, completed = 0, failed = 0, completed_with_death = 0;
};
// Enumerates every reachable state with `restarts` restarts and `retries` retries allowed.
counts enumerate(int restarts, int retries, bool in_segments, int hostile = -1) {
  restarts_allowed = restarts;
  retries_allowed = retries;
  segmented = in_segments;
  hostile_budget = hostile;
  world start;
  // The proofs cost an HMAC a message: the enumerations of honest workers alone (which never
  // need them) run without, as a ps without a secret does.
  const bool keyed = hostile >= 0;
  start.ps0.reset(n, 0, keyed ? proofs0 : sync_proofs{});
  start.ps1.reset(n, 0, keyed ? proofs1 : sync_proofs{});
  start.ps0s.reset(n, 0, keyed ? proofs0 : sync_proofs{});
  start.h.budget = hostile_budget;
  if (keyed) start.w[2].pc = worker::absent;  // 2 honest workers beside the hostile one
  std::vector<world> stack{start};
  std::set<std::string> seen{start.key()};
  counts c;
  while (!stack.empty()) {
    world s = std::move(stack.back());
    stack.pop_back();
    ++c.states;
    try {
      check(s);
      // Restarts of the dead aside, can anyone move? If not: I4.
      bool stuck = true;
      for (std::size_t i = 0; i < workers; ++i) {
        auto next = moves(s, i);
        if (s.w[i].pc != worker::dead && !next.empty()) stuck = false;
        for (auto& x : next)
          if (seen.insert(x.key()).second) stack.push_back(std::move(x));
      }
      if (hostile_budget >= 0)  // its moves never unstick the honest workers' (I4 is theirs)
        for (auto& x : hostile_moves(s))
          if (seen.insert(x.key()).second) stack.push_back(std::move(x));
      if (!stuck) continue;
      ++c.terminal;
      if (s.failed) {
        ++c.failed;
        continue;
      }
      EXPECT(s.ps0.step() == steps);  // I4: every step completed, on both ps
      EXPECT(s.ps1.step() == steps);
      ++c.completed;
      c.completed_with_death += live(s) < workers;
    } catch (const std::exception& e) {  // a violation, or an error a state machine threw
      FAIL("in state " << s.key() << ": " << e.what());
    }
  }
  return c;
}
}  // namespace sync_protocol_test

TEST_CASE("the synchronous protocol over every interleaving of 2 ps x 3 workers, N = 2, with deaths, retries and a hostile worker",
          "[sync][protocol]") {
  const auto [restarts, retries, segments, hostile, least] = GENERATE(table<int, int, bool, int, std::size_t>(
      {{0, 1, false, -1, 150000}, {1, 0, false, -1, 400000}, {0, 1, true, -1, 150000}, {0, 0, false, 2, 20000}}));
  const auto c = sync_protocol_test::enumerate(restarts, retries, segments, hostile);
  INFO(restarts << " restarts, " << retries << " retries, " << (segments ? "parts in 2 segments" : "whole parts")
                << (hostile >= 0 ? ", a hostile worker: " : ": ") << c.states << " states, " << c.terminal << " final");
  if (hostile >= 0) {  // it had parts in decisions, and commits refused for their rate
    CHECK(sync_protocol_test::hostile_admitted > 0);
    CHECK(sync_protocol_test::hostile_refused > 0);
  }
  // The enumeration reached the cases the protocol exists for.
  CHECK(c.states > least);
  CHECK(c.completed > 0);
  CHECK(c.completed_with_death > 0);
  CHECK(c.failed > 0);
}

#include <dtf/ps/sync_aggregator.hpp>

namespace sync_protocol_test {
struct no_tables {  // a model without embedding tables
  void reserve_rows(std::span<const dtf::ps_detail::contributed_rows>) {}
  void apply_rows(std::uint32_t, std::span<const std::uint64_t>, std::span<const float>, bool) noexcept {}
};
}  // namespace sync_protocol_test

TEST_CASE("a synchronous apply that fails part-way fails the ps loudly, never half a step silently",
          "[sync][protocol][errors]") {
  using dtf::apply_mode, dtf::errc, dtf::nonfinite_policy, dtf::rpc_reply, dtf::rpc_responder;
  using dtf::ps_detail::shard_store, dtf::ps_detail::sync_aggregator, dtf::ps_detail::sync_decision, dtf::ps_detail::update;
  namespace optim = dtf::optim;
  namespace data = dtf::data;
  namespace detail = dtf::detail;
  shard_store store;
  const std::vector<float> init(6, 1.0f);
  store.install(shard_store::from_payload({0, 1}, {3, 3}, {0, 0}, optim::sgd{1.0f}, 0, std::as_bytes(std::span(init))),
                optim::sgd{1.0f}, apply_mode::locked);
  sync_aggregator agg;
  agg.configure(2, store, 0, "initialised");
  sync_protocol_test::no_tables tables;
  std::vector<rpc_reply> replies;
  auto defer = [&] { return rpc_responder([&](rpc_reply r) { replies.push_back(std::move(r)); }); };
  std::size_t applied = 0;
  auto apply = [&](std::uint32_t id, const update& u) {
    if (applied == 1) throw std::bad_alloc();  // copy on write of the second shard fails
    store.apply(store.find(id), u);
    ++applied;
  };
  std::int64_t advanced_to = -1;
  auto advanced = [&](std::int64_t step, const std::map<std::string, data::position>&) { advanced_to = step; };
  auto status = [](rpc_reply&, const sync_decision&, bool, std::uint64_t) {};
  const std::vector<float> g(6, 0.5f);
  detail::ps_sync_push_msg m;
  m.ids = {0, 1};
  auto commit = [&](const std::string& who) {
    return agg.contribute(who, m, std::as_bytes(std::span(g)), {}, store, tables, nonfinite_policy::reject, defer,
                          apply, advanced, status);
  };
  REQUIRE_FALSE(commit("worker.0"));  // waits for the second
  CHECK_THROWS_WITH(commit("worker.1"), Catch::Contains("failed part-way through its apply"));
  CHECK(applied == 1);
  CHECK(advanced_to == -1);  // the step did not advance
  // Both committers were told, once each.
  REQUIRE(replies.size() == 1);  // worker.0's; worker.1 got the exception as its reply
  CHECK(replies[0].status == std::uint32_t(errc::peer_failure));
  // Every later synchronous request gets the error: the shards no longer hold one step.
  CHECK_THROWS_WITH(commit("worker.2"), Catch::Contains("failed part-way"));
  CHECK(replies.size() == 1);
}
