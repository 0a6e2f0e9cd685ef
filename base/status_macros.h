// Status propagation for functions that return absl::Status or absl::StatusOr<T>.
//
//   WINNOW_RETURN_IF_ERROR(DoThing());
//   WINNOW_ASSIGN_OR_RETURN(auto model, Model::Load(path));
//   WINNOW_ASSIGN_OR_RETURN(existing_var, Parse(text));
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define WINNOW_STATUS_CONCAT_INNER_(a, b) a##b
#define WINNOW_STATUS_CONCAT_(a, b) WINNOW_STATUS_CONCAT_INNER_(a, b)

#define WINNOW_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    if (::absl::Status winnow_status_ = (expr);       \
        !winnow_status_.ok()) {                       \
      return winnow_status_;                          \
    }                                                 \
  } while (false)

// `lhs` may declare a variable (`auto x`, `std::string y`) or name an existing one.
#define WINNOW_ASSIGN_OR_RETURN(lhs, expr) \
  WINNOW_ASSIGN_OR_RETURN_IMPL_(WINNOW_STATUS_CONCAT_(winnow_statusor_, __LINE__), lhs, expr)

#define WINNOW_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)
