// A short REINFORCE run on the real SmolLM2-135M (label model): from an untrained MLP, a couple
// of dozen updates on real text lower the KL of its deterministic keep-sets on held-out text.
// The texts are this repository's own docs (always present): trained on docs/design.md, held
// out README.md.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>

#include <distillcache/distillcache.hpp>

#include "../support/smollm2_path.hpp"

namespace {
const std::filesystem::path kRepo = std::filesystem::path(DC_FIXTURE_DIR) / ".." / "..";
}

TEST_CASE("a short training run on SmolLM2 lowers held-out KL below the untrained policy's") {
  const auto path = dc_test::smollm2_gguf_path();
  if (!std::filesystem::exists(path)) {
    MESSAGE("SmolLM2 GGUF not found at " << path.string() << " (scripts/fetch_model.sh): skipped");
    return;
  }
  dc::GgufFile file(path.string());
  dc::HfModel m = dc::load_gguf_model(file);
  const dc::Tokenizer tokenizer(dc::tokenizer_data_from_gguf(file));
  dc::TrainerOptions opt;
  opt.context = 64;
  opt.continuation = 8;
  opt.budgets = {0.25};
  opt.rollouts = 4;
  opt.updates = 24;
  opt.warmup = 2;
  opt.lr = 1e-2f;
  opt.lr_floor = 1e-3f;
  opt.granularity = dc::Granularity::layer;
  const int len = opt.context + opt.continuation;
  auto train = dc::token_windows(tokenizer, kRepo / "docs" / "design.md", len, 24);
  const auto held_out = dc::token_windows(tokenizer, kRepo / "README.md", len, 4);
  REQUIRE(train.size() >= 8);
  REQUIRE(held_out.size() == 4);

  dc::Transformer<dc::cpu> model(m.config, std::move(m.weights), 64);
  auto policy = dc::MlpPolicy::initialised(dc::paper_policy_inputs(), {16, 16}, 3, dc::Activation::silu, 0);
  dc::ReinforceTrainer<dc::cpu, float> trainer(model, policy, opt, std::move(train));
  const double before = trainer.validate(held_out)[0];
  while (!trainer.done()) trainer.update();
  const double after = trainer.validate(held_out)[0];
  MESSAGE("held-out KL at 25 %: untrained " << before << ", after " << opt.updates << " updates " << after);
  CHECK(after < before);
}
