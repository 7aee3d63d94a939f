// fmt's compiled part, built into spank_dtrain.so so that the plugin does not load libfmt.so into srun and root's
// slurmstepd. Debian 12 ships fmt only as a shared library; dtrain's static libraries that the plugin links call its
// non-inline functions (fmt::vformat, the float formatting of dragonbox, ...). This object defines all of them: the
// linker resolves those calls here, before it reaches libfmt.so, and --as-needed then leaves libfmt out of the
// plugin's NEEDED entries. Like the rest of the plugin they stay local (plugin/exports.map; tests/build/
// hardening_test.sh checks both). Compiled only when fmt::fmt is a shared library (spank_plugin/CMakeLists.txt).
//
// The definitions are fmt's own (format-inl.h, shipped with its headers); the explicit instantiations below are the
// templates format.h declares with FMT_API and defines only in format-inl.h, for fmt 9.
#include <fmt/format-inl.h>

#include <locale>

static_assert(FMT_VERSION >= 90000 && FMT_VERSION < 100000,
              "spank_plugin/plugin/fmt_local.cc instantiates fmt 9's compiled templates; for another fmt version, "
              "instantiate the templates its format.h declares with FMT_API");

FMT_BEGIN_NAMESPACE
namespace detail {

template auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;

template locale_ref::locale_ref(const std::locale& loc);
template auto locale_ref::get<std::locale>() const -> std::locale;

template auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl(locale_ref) -> char;
template auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template auto decimal_point_impl(locale_ref) -> wchar_t;

}  // namespace detail
FMT_END_NAMESPACE
