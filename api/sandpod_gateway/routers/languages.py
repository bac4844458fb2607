"""/v1/languages: what executions can be written in."""

from fastapi import APIRouter

from sandpod_gateway.dependencies import CatalogDep, CurrentTenant
from sandpod_gateway.errors import error_responses
from sandpod_gateway.schemas import LanguageList

router = APIRouter(
    prefix="/v1/languages", tags=["languages"], responses=error_responses(401, 429, 503)
)


@router.get("", response_model=LanguageList, summary="List languages")
async def list_languages(tenant: CurrentTenant, catalog: CatalogDep) -> LanguageList:
    return LanguageList(languages=catalog.all())
