package bench

import (
	"crypto/sha256"
	"fmt"
	"runtime"
	"slices"
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

// WakeupRoundTrip returns the median time, in microseconds, of n round
// trips of one byte between two threads over a pair of pipes, each thread
// blocked in read(2) until the other writes: two thread wake-ups per round
// trip. Every path the benchmarks time (a queued packet answered, an API
// write reaching the agent, a probe) waits on such wake-ups; on a VM their
// cost moves with the host (halt polling, interrupts to idle vCPUs) while
// the CPU's speed stays the same.
func WakeupRoundTrip(n int) (float64, error) {
	if n <= 0 {
		return 0, fmt.Errorf("round trips: %d, want > 0", n)
	}
	var ping, pong [2]int
	if err := unix.Pipe2(ping[:], unix.O_CLOEXEC); err != nil {
		return 0, err
	}
	defer unix.Close(ping[0])
	defer unix.Close(ping[1])
	if err := unix.Pipe2(pong[:], unix.O_CLOEXEC); err != nil {
		return 0, err
	}
	defer unix.Close(pong[0])
	defer unix.Close(pong[1])
	// The echo thread: read a byte from ping, write it to pong; a zero
	// byte ends it.
	echoed := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b := []byte{0}
		for {
			if _, err := unix.Read(ping[0], b); err != nil {
				echoed <- err
				return
			}
			if _, err := unix.Write(pong[1], b); err != nil {
				echoed <- err
				return
			}
			if b[0] == 0 {
				echoed <- nil
				return
			}
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rtts := make([]time.Duration, 0, n)
	b := []byte{1}
	var err error
	for i := 0; i <= n && err == nil; i++ {
		b[0] = 1
		if i == n {
			b[0] = 0
		}
		t0 := time.Now()
		if _, err = unix.Write(ping[1], b); err == nil {
			_, err = unix.Read(pong[0], b)
		}
		if i < n {
			rtts = append(rtts, time.Since(t0))
		}
	}
	if err != nil {
		return 0, fmt.Errorf("pipe round trip: %w", err)
	}
	if err := <-echoed; err != nil {
		return 0, fmt.Errorf("pipe echo: %w", err)
	}
	slices.Sort(rtts)
	return round(float64(rtts[len(rtts)/2])/float64(time.Microsecond), 1), nil
}
