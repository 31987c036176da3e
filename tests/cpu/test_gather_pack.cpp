// cpu/gather_pack.hpp's loops (AVX-512 where the build has it, portable otherwise) against the
// plain loops they replace, at every length around the vector width.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <distillcache/cpu/gather_pack.hpp>

TEST_CASE("gather, position flags and the packing loops give what the plain loops give") {
  std::mt19937 rng(3);
  for (int n = 0; n <= 70; ++n) {
    CAPTURE(n);
    std::vector<float> table(97);
    for (float& t : table) t = float(rng() % 1000) * 0.25f;
    std::vector<std::int32_t> index(std::size_t(n) + 1);
    for (auto& i : index) i = std::int32_t(rng() % table.size());
    std::vector<float> got(std::size_t(n) + 1, -1.0f);
    dc::cpu_detail::gather(table.data(), index.data(), n, got.data());
    for (int i = 0; i < n; ++i) CHECK(got[std::size_t(i)] == table[std::size_t(index[std::size_t(i)])]);
    CHECK(got[std::size_t(n)] == -1.0f);  // nothing written past n

    // Positions inside the table, past its end and negative: the last two read as 0.
    std::vector<std::int32_t> flags_table(50), position(static_cast<std::size_t>(n)), flag(std::size_t(n) + 1, 7);
    for (auto& t : flags_table) t = std::int32_t(rng() % 2);
    for (auto& p : position) p = std::int32_t(rng() % 70) - 10;
    dc::cpu_detail::lookup_position_flags(flags_table.data(), 50, position.data(), n, flag.data());
    for (int i = 0; i < n; ++i) {
      const std::int32_t p = position[std::size_t(i)];
      CHECK(flag[std::size_t(i)] == (p >= 0 && p < 50 ? flags_table[std::size_t(p)] : 0));
    }
    CHECK(flag[std::size_t(n)] == 7);

    std::vector<float> score(static_cast<std::size_t>(n));
    std::vector<std::uint32_t> values(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      score[std::size_t(i)] = rng() % 3 == 0 ? INFINITY : rng() % 5 == 0 ? NAN : float(rng() % 9) - 4.0f;
      values[std::size_t(i)] = std::uint32_t(rng());
    }
    std::vector<std::int32_t> rows_expected;
    std::vector<std::uint32_t> values_expected;
    for (int i = 0; i < n; ++i)
      if (score[std::size_t(i)] != INFINITY) {  // a NaN is not +inf: open
        rows_expected.push_back(100 + i);
        values_expected.push_back(values[std::size_t(i)]);
      }
    std::vector<std::int32_t> rows(static_cast<std::size_t>(n));
    std::vector<std::uint32_t> packed(static_cast<std::size_t>(n));
    const int count = dc::cpu_detail::pack_rows_not_inf(score.data(), n, 100, rows.data());
    REQUIRE(count == int(rows_expected.size()));
    CHECK(std::vector<std::int32_t>(rows.begin(), rows.begin() + count) == rows_expected);
    REQUIRE(dc::cpu_detail::pack_values_not_inf(values.data(), score.data(), n, packed.data()) == count);
    CHECK(std::vector<std::uint32_t>(packed.begin(), packed.begin() + count) == values_expected);

    for (int shift : {0, 8, 24}) {
      const std::uint32_t digit = values.empty() ? 0u : (values[0] >> shift) & 255u;
      std::vector<std::uint32_t> expected;
      for (std::uint32_t v : values)
        if (((v >> shift) & 255u) == digit) expected.push_back(v);
      std::vector<std::uint32_t> out(static_cast<std::size_t>(n));
      const std::size_t m = dc::cpu_detail::pack_keys_with_digit(values.data(), std::size_t(n), shift, digit, out.data());
      REQUIRE(m == expected.size());
      CHECK(std::vector<std::uint32_t>(out.begin(), out.begin() + std::ptrdiff_t(m)) == expected);
    }
  }
}
