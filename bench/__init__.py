"""`toolkit bench`: a load generator that submits requests on an exact schedule and measures what operators need."""
