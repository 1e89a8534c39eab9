package bench

import (
	"crypto/sha256"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Contention runs a fixed CPU-bound loop on one thread for about d and
// returns wall time / the thread's CPU time: 1 on an idle machine, 2 when
// the thread got half a CPU. hack/bench.sh records it next to every section
// whose results are times rather than ratios against an interleaved control,
// so that those times can be read for what they are on a shared machine.
// speed is how fast the CPU the thread got was: MiB hashed (SHA-256) per
// second of the thread's CPU time. A VM's CPU can be slower from one run to
// the next with nothing else running in the guest (its host's other
// tenants, its clock): contention stays 1 then, and speed shows it.
func Contention(d time.Duration) (ratio, speed float64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() time.Duration {
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		return time.Duration(ts.Nano())
	}
	buf := make([]byte, 64<<10)
	n := 0
	w0, c0 := time.Now(), cpu()
	for time.Since(w0) < d {
		sum := sha256.Sum256(buf)
		buf[0] = sum[0]
		n++
	}
	w, c := time.Since(w0), cpu()-c0
	if c <= 0 {
		return 0, 0
	}
	return round(w.Seconds()/c.Seconds(), 2), round(float64(n*len(buf))/(1<<20)/c.Seconds(), 1)
}
