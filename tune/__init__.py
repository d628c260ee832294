"""`toolkit tune`: the tuning guide as a closed loop (launch, load, diagnose, change one flag, keep or revert)."""
