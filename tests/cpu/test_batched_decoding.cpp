// Batched decoding (Transformer::forward_batch, DecoderBatch, the batched evaluator): one step
// for several sequences, each with its own KV cache, must give every sequence bit for bit the
// logits, the cache contents and the eviction decisions of decoding it alone. The caches differ
// in every way a batch allows: prompt length, keep-sets (shared, per-head), observation window,
// query statistics, capacity; the tiny Mistral has a sliding window of 8 and 2 KV heads.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <distillcache/distillcache.hpp>

namespace {

const std::string kFixtures = DC_FIXTURE_DIR;

dc::Transformer<dc::cpu> tiny_mistral_swa(int max_chunk) {
  dc::HfModel m = dc::load_hf_model(kFixtures + "/tiny_mistral_swa");
  return dc::Transformer<dc::cpu>(m.config, std::move(m.weights), max_chunk);
}

std::vector<std::int32_t> tokens(int n, int salt) {
  std::vector<std::int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(std::int32_t(3 + (37 * i + 11 * salt) % 250));
  return ids;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Everything of a cache a later step or eviction reads: slots of every head, positions, stats.
bool same_cache(const dc::KVCache<dc::cpu>& a, const dc::KVCache<dc::cpu>& b) {
  if (a.next_position() != b.next_position()) return false;
  for (int l = 0; l < a.num_layers(); ++l) {
    if (a.length(l) != b.length(l)) return false;
    for (int h = 0; h < a.num_kv_heads(); ++h) {
      if (a.host_positions(l, h) != b.host_positions(l, h)) return false;
      const std::size_t kv = std::size_t(a.length(l)) * std::size_t(a.head_dim());
      const auto at = [&](const float* base, const dc::KVCache<dc::cpu>& c) {
        return std::span<const float>(base + std::size_t(h) * std::size_t(c.capacity(l)) * std::size_t(c.head_dim()), kv);
      };
      if (!same_bits(at(a.keys(l), a), at(b.keys(l), b)) || !same_bits(at(a.values(l), a), at(b.values(l), b)))
        return false;
      for (int r = 0; r < a.stat_rows(); ++r) {
        const auto stats = [&](const dc::KVCache<dc::cpu>& c) {
          return std::span<const float>(
              c.stats(l) + (std::size_t(h) * std::size_t(c.stat_rows()) + std::size_t(r)) * std::size_t(c.capacity(l)),
              std::size_t(c.length(l)));
        };
        if (!same_bits(stats(a), stats(b))) return false;
      }
    }
  }
  return true;
}

// Five sequences whose caches differ: lengths 9..21, statistics from different positions, one
// collecting query statistics, one compacted to per-head keep-sets, one to a shared set.
struct Sequences {
  std::vector<std::unique_ptr<dc::KVCache<dc::cpu>>> caches;

  Sequences(dc::Transformer<dc::cpu>& model, int extra) {
    const auto& ctx = model.context();
    for (int s = 0; s < 5; ++s) {
      const int n = 9 + 3 * s;
      caches.push_back(std::make_unique<dc::KVCache<dc::cpu>>(model.make_cache(n + extra + 2 * s)));
      dc::KVCache<dc::cpu>& c = *caches.back();
      c.set_observed_from(s == 0 ? 0 : n - s);
      if (s == 2) c.collect_queries({n - 4}, model.config().rope_theta);
      model.forward(tokens(n, s), c);
      if (s == 3) {  // per-head sets: head 0 keeps the even slots, head 1 the last ones
        std::vector<std::int32_t> keep;
        const int count = n / 2;
        for (int i = 0; i < count; ++i) keep.push_back(2 * i);
        for (int i = 0; i < count; ++i) keep.push_back(n - count + i);
        for (int l = 0; l < c.num_layers(); ++l) c.compact_heads(ctx, l, keep);
      }
      if (s == 4) {
        std::vector<std::int32_t> keep{0, 1, 5, 8, 13, 17, 19, 20};
        c.compact(ctx, keep);
      }
    }
  }
  Sequences copy(dc::Transformer<dc::cpu>& model) const {
    Sequences out;
    for (const auto& c : caches) {
      out.caches.push_back(std::make_unique<dc::KVCache<dc::cpu>>(c->shape(), std::span<const int>(c->capacities())));
      out.caches.back()->copy_from(model.context(), *c);
    }
    return out;
  }
  std::vector<dc::KVCache<dc::cpu>*> pointers() const {
    std::vector<dc::KVCache<dc::cpu>*> p;
    for (const auto& c : caches) p.push_back(c.get());
    return p;
  }

 private:
  Sequences() = default;
};

}  // namespace

TEST_CASE("forward_batch gives every sequence its single-sequence logits and cache, bit for bit") {
  // max_chunk 3 < 5 sequences: the batch runs as two chunks, like a batch beyond max_chunk.
  for (int max_chunk : {3, 8}) {
    CAPTURE(max_chunk);
    auto model = tiny_mistral_swa(max_chunk);
    const int steps = 6;
    Sequences batched(model, steps), alone = batched.copy(model);
    const std::size_t vocab = std::size_t(model.config().vocab_size);
    std::vector<float> out(5 * vocab);
    for (int t = 0; t < steps; ++t) {
      std::vector<std::int32_t> next;
      for (int s = 0; s < 5; ++s) next.push_back(std::int32_t(5 + 7 * s + 13 * t));
      model.forward_batch(next, batched.pointers(), out);
      for (int s = 0; s < 5; ++s) {
        CAPTURE(t);
        CAPTURE(s);
        const auto single = model.forward(std::span<const std::int32_t>(&next[std::size_t(s)], 1),
                                          *alone.caches[std::size_t(s)]);
        CHECK(same_bits(std::span<const float>(out).subspan(std::size_t(s) * vocab, vocab), single));
        CHECK(same_cache(*batched.caches[std::size_t(s)], *alone.caches[std::size_t(s)]));
      }
    }
    // The query statistics of sequence 2 saw the same queries.
    const auto& qa = batched.caches[2]->query_statistics();
    const auto& qb = alone.caches[2]->query_statistics();
    const int d = qa.head_dim();
    for (int l = 0; l < batched.caches[2]->num_layers(); ++l) {
      CHECK(qa.count(l) == qb.count(l));
      CHECK(qa.count(l) == 4 + steps);
      std::vector<double> ma(static_cast<std::size_t>(d)), ca(static_cast<std::size_t>(d * d));
      std::vector<double> mb = ma, cb = ca;
      qa.mean_and_covariance(l, 1, ma.data(), ca.data());
      qb.mean_and_covariance(l, 1, mb.data(), cb.data());
      CHECK(ma == mb);
      CHECK(ca == cb);
    }
  }
}

TEST_CASE("the batched logits on the backend are the host logits") {
  auto model = tiny_mistral_swa(8);
  Sequences a(model, 1), b = a.copy(model);
  const std::size_t vocab = std::size_t(model.config().vocab_size);
  const std::vector<std::int32_t> next{4, 9, 16, 25, 36};
  std::vector<float> host(5 * vocab);
  model.forward_batch(next, a.pointers(), host);
  const float* on_backend = model.forward_batch_logits_on_backend(next, b.pointers());
  CHECK(same_bits(host, std::span<const float>(on_backend, 5 * vocab)));
}

TEST_CASE("forward_batch rejects a bad batch before touching any cache") {
  auto model = tiny_mistral_swa(4);
  Sequences seq(model, 1);
  auto caches = seq.pointers();
  const std::size_t vocab = std::size_t(model.config().vocab_size);
  std::vector<float> out(5 * vocab);
  const std::vector<std::int32_t> five{1, 2, 3, 4, 5};
  CHECK_THROWS_WITH(model.forward_batch(std::vector<std::int32_t>{1, 2}, caches, out),
                    doctest::Contains("2 tokens for 5 caches"));
  auto twice = caches;
  twice[3] = twice[1];
  CHECK_THROWS_WITH(model.forward_batch(five, twice, out), doctest::Contains("share one KV cache"));
  auto with_null = caches;
  with_null[0] = nullptr;
  CHECK_THROWS_WITH(model.forward_batch(five, with_null, out), doctest::Contains("is null"));
  CHECK_THROWS_WITH(model.forward_batch(std::vector<std::int32_t>{1, 2, 3, 4, 9999}, caches, out),
                    doctest::Contains("outside vocabulary"));
  std::vector<float> small(vocab);
  CHECK_THROWS_WITH(model.forward_batch(five, caches, small), doctest::Contains("logits buffer"));
  CHECK_THROWS_WITH(model.forward_batch_logits_on_backend(five, caches), doctest::Contains("max_chunk"));
  // A full cache anywhere in the batch: nothing appended to the others.
  std::vector<int> before;
  for (auto* c : caches) before.push_back(c->next_position());
  auto full = model.make_cache(2);
  model.forward(tokens(2, 0), full);
  auto with_full = caches;
  with_full[4] = &full;
  CHECK_THROWS_WITH(model.forward_batch(five, with_full, out), doctest::Contains("KV cache full"));
  for (std::size_t s = 0; s < 4; ++s) CHECK(caches[s]->next_position() == before[s]);
}

TEST_CASE("DecoderBatch evicts each decoder exactly as its own step() would") {
  auto model = tiny_mistral_swa(4);
  dc::H2OPolicy h2o;
  dc::SnapKVPolicy snapkv(6);
  dc::StreamingPolicy streaming;
  dc::RandomPolicy random_batched(7), random_alone(7);  // stateful: one generator per side
  struct Spec {
    dc::EvictionPolicy *batched, *alone;
    double fraction;
    dc::Granularity granularity;
  };
  const std::vector<Spec> specs{{&h2o, &h2o, 0.25, dc::Granularity::head},
                                {&snapkv, &snapkv, 0.5, dc::Granularity::layer},
                                {&streaming, &streaming, 0.4, dc::Granularity::shared},
                                {&random_batched, &random_alone, 0.3, dc::Granularity::head},
                                {&h2o, &h2o, 0.6, dc::Granularity::shared}};
  const int prompt_len = 20, steps = 12;
  auto make = [&](dc::EvictionPolicy& policy, const Spec& s) {
    dc::Budget b = dc::Budget::of_fraction(s.fraction);
    b.chunk = 3;
    return std::make_unique<dc::EvictingDecoder<dc::cpu>>(model, policy, b, dc::EvictionMode::decode,
                                                          prompt_len, steps, s.granularity);
  };
  std::vector<std::unique_ptr<dc::EvictingDecoder<dc::cpu>>> batched, alone;
  std::vector<dc::EvictingDecoder<dc::cpu>*> batch;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    batched.push_back(make(*specs[i].batched, specs[i]));
    alone.push_back(make(*specs[i].alone, specs[i]));
    const auto prompt = tokens(prompt_len - int(i), int(i));
    batched.back()->prefill(prompt);
    alone.back()->prefill(prompt);
    batch.push_back(batched.back().get());
  }
  dc::DecoderBatch<dc::cpu> stepper;
  for (int t = 0; t < steps; ++t) {
    std::vector<std::int32_t> next;
    for (std::size_t i = 0; i < specs.size(); ++i) next.push_back(std::int32_t(10 + 3 * t + 17 * int(i)));
    stepper.step(batch, next);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      CAPTURE(t);
      CAPTURE(i);
      const auto single = alone[i]->step(next[i]);
      CHECK(same_bits(batched[i]->logits(), single));
      CHECK(batched[i]->evictions() == alone[i]->evictions());
      CHECK(same_cache(batched[i]->cache(), alone[i]->cache()));
    }
  }
  for (std::size_t i = 0; i < specs.size(); ++i) CHECK(batched[i]->evictions() >= 2);

  CHECK_THROWS_WITH(stepper.step(batch, std::vector<std::int32_t>{1}), doctest::Contains("decoders for"));
  auto other = tiny_mistral_swa(4);
  dc::EvictingDecoder<dc::cpu> stranger(other, h2o, dc::Budget::of_fraction(0.5), dc::EvictionMode::decode,
                                        prompt_len, steps);
  stranger.prefill(tokens(8, 1));
  std::vector<dc::EvictingDecoder<dc::cpu>*> mixed{batch[0], &stranger};
  CHECK_THROWS_WITH(stepper.step(mixed, std::vector<std::int32_t>{1, 2}), doctest::Contains("different models"));
}

TEST_CASE("the evaluator's totals do not depend on its batch size") {
  auto model = tiny_mistral_swa(4);
  dc::H2OPolicy h2o;
  dc::SnapKVPolicy snapkv(6);
  dc::TOVAPolicy tova;
  const std::vector<dc::Budget> budgets{dc::Budget::of_fraction(0.25), dc::Budget::of_fraction(0.5)};
  auto run = [&](std::size_t max_batch) {
    dc::FidelityEvaluator<dc::cpu, float> eval(model, {&h2o, &snapkv, &tova}, budgets,
                                               dc::EvictionMode::decode,
                                               {dc::Granularity::shared, dc::Granularity::head});
    eval.set_max_batch(max_batch);
    std::vector<std::size_t> order;
    for (int c = 0; c < 2; ++c) {
      const auto w = tokens(30, c);
      eval.add_context(std::span(w).first(20), std::span(w).subspan(20),
                       [&](std::size_t i) { order.push_back(i); });
    }
    CHECK(order.size() == 2 * eval.totals().size());
    std::vector<double> kl;
    for (const auto& t : eval.totals()) kl.push_back(t.kl_mean());
    return kl;
  };
  const auto one = run(1), five = run(5), all = run(64);
  CHECK(one == five);
  CHECK(one == all);
  using Evaluator = dc::FidelityEvaluator<dc::cpu, float>;
  CHECK_THROWS_WITH(Evaluator(model, {&h2o}, budgets, dc::EvictionMode::decode).set_max_batch(0),
                    doctest::Contains("batch of 0"));
}
