// attn_viz_tests draws text with Cairo.
// LeakSanitizer (ASan builds only): Cairo resolves its toy font faces through fontconfig once per
// process and keeps them in static caches that LSan cannot see through; those few hundred bytes are
// reported as leaked at exit. Only allocations made inside libfontconfig are ignored, so leaks of
// attn's own are still caught. Without a sanitizer nothing calls this function.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libfontconfig.so\n";
}
