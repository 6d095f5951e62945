package main

import (
	"syscall"
	"time"
)

// preciseSleep blocks the calling goroutine's thread in the kernel for d
// (nanosleep), which wakes it within tens of microseconds of d, where the
// runtime's timers may take a millisecond. A signal (the runtime's
// preemption, say) interrupts the sleep, which then goes on for what is
// left.
func preciseSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var left syscall.Timespec
		if err := syscall.Nanosleep(&ts, &left); err != syscall.EINTR {
			return
		}
		ts = left
	}
}
