package bench

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100, nearest rank) of ds;
// 0 when ds is empty. ds is sorted in place.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(p/100*float64(len(ds)))) - 1
	i = max(0, min(i, len(ds)-1))
	return ds[i]
}

// Median of xs (the mean of the two middle values for even lengths); NaN
// when empty. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Result is an ordered list of name=value measurements, the machine-readable
// output of every benchmark (hack/bench.sh collects them into one file).
type Result struct {
	names  []string
	values map[string]string
}

// Set records a value (formatted with %v; float64 with up to 4 decimals).
func (r *Result) Set(name string, v any) {
	if r.values == nil {
		r.values = map[string]string{}
	}
	var s string
	switch x := v.(type) {
	case float64:
		s = FormatFloat(x)
	case time.Duration:
		s = FormatFloat(x.Seconds())
	default:
		s = fmt.Sprint(v)
	}
	if _, ok := r.values[name]; !ok {
		r.names = append(r.names, name)
	}
	r.values[name] = s
}

// Get returns a recorded value.
func (r *Result) Get(name string) (string, bool) {
	v, ok := r.values[name]
	return v, ok
}

// Float returns a recorded value as a number (NaN when missing or not a number).
func (r *Result) Float(name string) float64 {
	v, ok := r.values[name]
	if !ok {
		return math.NaN()
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return math.NaN()
	}
	return f
}

// Merge adds every value of o (later values win).
func (r *Result) Merge(o *Result) {
	for _, n := range o.names {
		r.Set(n, o.values[n])
	}
}

// Names returns the recorded names in recording order.
func (r *Result) Names() []string { return append([]string(nil), r.names...) }

// Lines formats the result as name=value lines.
func (r *Result) Lines() string {
	var b strings.Builder
	for _, n := range r.names {
		fmt.Fprintf(&b, "%s=%s\n", n, r.values[n])
	}
	return b.String()
}

// ParseLines reads name=value lines; other lines are ignored.
func ParseLines(text string) *Result {
	r := &Result{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t#") {
			continue
		}
		r.Set(k, v)
	}
	return r
}

// FormatFloat prints f with at most 4 decimals and no trailing zeros
// (enough for ratios; values in ms or µs are rounded by their producer).
func FormatFloat(f float64) string {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return "NaN"
	}
	s := strconv.FormatFloat(f, 'f', 4, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// round rounds to d decimals.
func round(f float64, d int) float64 {
	p := math.Pow(10, float64(d))
	return math.Round(f*p) / p
}

// micros and millis convert durations for the name=value lines.
func micros(d time.Duration) float64 { return round(float64(d)/float64(time.Microsecond), 1) }
func millis(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }
