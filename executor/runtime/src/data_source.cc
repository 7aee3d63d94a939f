#include "dtrain/exec/data_source.h"

#include <fmt/format.h>

#include "data_sources.h"
#include "dtrain/common/error.h"

namespace dtrain::exec {

nlohmann::json DataPosition::to_json() const { return {{"samples_consumed", samples_consumed}}; }

DataPosition DataPosition::from_checkpoint(std::int64_t step, const nlohmann::json& metadata,
                                           const std::string& where) {
  auto it = metadata.find("samples_consumed");
  if (it == metadata.end() || !it->is_number_integer()) {
    throw Error(
        ErrorCategory::kIo, ExitCode::kCheckpointMismatch,
        fmt::format("{}: the metadata has no integer 'samples_consumed' (the data position to resume from)", where));
  }
  return {step, it->get<std::int64_t>()};
}

DataSource::DataSource(const DataSourceOptions& options) : options_(options) {}

void DataSource::micro_batch(std::int64_t step, int mb, std::int32_t* inputs, std::int32_t* targets) const {
  const DataSourceOptions& o = options_;
  const std::int64_t first = position(step).samples_consumed +
                             static_cast<std::int64_t>(o.dp_rank) * (o.global_batch / o.dp_size) +
                             static_cast<std::int64_t>(mb) * o.micro_batch;
  for (int b = 0; b < o.micro_batch; ++b) sample(first + b, inputs + b * o.seq_len, targets + b * o.seq_len);
}

DataPosition DataSource::position(std::int64_t step) const {
  return {step, restored_.samples_consumed + (step - restored_.step) * options_.global_batch};
}

void DataSource::restore(const DataPosition& position) { restored_ = position; }

std::unique_ptr<DataSource> open_data_source(const DataSourceOptions& options) {
  if (options.spec == "synthetic") return detail::synthetic_data(options);
  if (detail::is_token_file(options.spec)) return detail::open_token_file(options);
  return detail::open_megatron_data(options);
}

}  // namespace dtrain::exec
