"""Operations every face uses (API, CLI, dashboard), written as ops over the Redis layer."""
