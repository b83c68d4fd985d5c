// Checks of a plan's page-split work decomposition shared by the planner tests
// (cuda_plan_shares_test.cpp) and the decode attention tests (cuda_decode_attention_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "cuda/plan_impl.h"

namespace cisa {

// Entries of a list's page list (its fixed ranges and its budget), as the planner sizes it.
inline int64_t list_pages(const cuda::detail::ListDesc& d) {
  return (d.pre_end - d.pre_begin) + d.k + (d.post_end - d.post_begin);
}

// Walks the plan's block slots (tasks [b · S, b · S + S) of slot b): every list's pages must be
// read once, in order, by tasks of nonzero length. Returns each slot's page count and, into
// by_list, each list's tasks in page order.
inline std::vector<int64_t> slot_shares(
    const cuda::Plan::Impl& P,
    std::map<int32_t, std::vector<const cuda::detail::AttnTask*>>* by_list = nullptr) {
  const auto S = static_cast<size_t>(P.tasks_per_block);
  std::vector<int64_t> next(P.lists.size()), shares;
  for (size_t L = 0; L < P.lists.size(); ++L) next[L] = P.lists[L].out_begin;
  for (size_t b = 0; b < P.tasks.size() / S; ++b) {
    int64_t share = 0;
    for (size_t j = 0; j < S; ++j) {
      const auto& t = P.tasks[b * S + j];
      if (t.rows == 0) continue;
      EXPECT_EQ(t.page0, next[static_cast<size_t>(t.list)]) << "slot " << b << " task " << j;
      EXPECT_LT(t.page0, t.page1);
      next[static_cast<size_t>(t.list)] = t.page1;
      share += t.page1 - t.page0;
      if (by_list) (*by_list)[t.list].push_back(&t);
    }
    shares.push_back(share);
  }
  for (size_t L = 0; L < P.lists.size(); ++L)
    EXPECT_EQ(next[L], P.lists[L].out_begin + list_pages(P.lists[L])) << "list " << L;
  return shares;
}

}  // namespace cisa
