# hack/conformance/toolslib.sh: sourced by hack/conformance/tools.sh and
# hack/conformance/npa-tools.sh, which share the tools cache ($TOOLS), its
# lock and their Go build settings. Needs log(), $TOOLS and $STAMP.

# tools_lock: hold $TOOLS/.lock (fd 9) for the rest of the script, waiting
# for another build that holds it.
tools_lock() {
	exec 9>"$TOOLS/.lock"
	if ! flock -n 9; then
		log "another build holds $TOOLS/.lock; waiting for it"
		flock 9
	fi
}

# tools_go_env: module-mode, static, reproducible builds outside any workspace.
tools_go_env() {
	export GOWORK=off
	export GOFLAGS="-mod=mod -buildvcs=false"
	export CGO_ENABLED=0
	export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
}

# tools_begin: exit through done_ when up_to_date (checked again once the lock
# is held: another build may just have made them), else hold the lock, set the
# Go environment, start the clock ($start) and drop the stale stamp.
tools_begin() {
	up_to_date && done_
	tools_lock
	up_to_date && done_
	tools_go_env
	start=$(date +%s)
	rm -f "$STAMP"
}
